"""A researcher's recommender in the sandbox: named by import path, held to the protocol (its failures
and bad pages counted and served by the fallback), a maintained library (Cornac) run for real, the
plug-in's file in the run's fingerprint."""

import argparse
import json
from collections import Counter

import numpy as np
import pytest
from sandbox_fakes import Recording, embed

from agents.sandbox.config import RecommenderConfig, load_config
from agents.sandbox.recommender import Feed
from agents.sandbox.run import run

PLUGIN = '''
class Misbehaving:
    """Ranks by id; config.options["mode"] says how it breaks the protocol."""

    def __init__(self, items, rng, config):
        self.items, self.mode = sorted(items), config.options.get("mode", "ok")

    def fit(self, clicks, seed=None):
        if self.mode == "raise_fit":
            raise RuntimeError("cannot fit")

    def rank(self, user, exclude, n):
        if self.mode == "raise_rank":
            raise RuntimeError("cannot rank")
        page = [i for i in self.items if i not in exclude][:n]
        return {
            "ok": page,
            "unknown": [*page[:-1], -5],
            "repeat": [*page[:-1], page[0]],
            "few": page[:-1],
            "excluded": [*page[:-1], sorted(exclude)[0]],
        }[self.mode]
'''

ITEMS = list(range(100, 140))


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "my_recs.py"
    path.write_text(PLUGIN)
    return f"{path}:Misbehaving"


def feed(kind, **options):
    config = RecommenderConfig(kind=kind, options=options, page_size=5, fallback="popularity")
    counts = Counter()
    made = Feed(config, ITEMS, np.random.default_rng(0), counts)
    made.train([(1, 139), (2, 139), (3, 138)])
    return made, counts


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("unknown", "unknown_item"),
        ("repeat", "repeated_item"),
        ("few", "too_few_items"),
        ("excluded", "excluded_item"),
        ("raise_rank", "rank_raised"),
        ("raise_fit", "unfitted"),
    ],
)
def test_a_recommender_that_breaks_the_protocol_is_counted_and_the_fallback_serves(plugin, mode, reason):
    made, counts = feed(plugin, mode=mode)
    items, _ = made.page(7, {100})
    assert items == [139, 138, 101, 102, 103]  # the popularity fallback's page
    assert counts[f"recommender_refused:{plugin}:{reason}"] == 1
    if mode == "raise_fit":
        assert counts[f"recommender_refused:{plugin}:fit_raised"] == 1


def test_a_recommender_that_keeps_the_protocol_serves_its_own_pages(plugin):
    made, counts = feed(plugin, mode="ok")
    assert made.page(7, {100})[0] == [101, 102, 103, 104, 105] and not counts


def test_an_unknown_kind_is_a_config_error():
    with pytest.raises(Exception, match="not random, popularity, mf or package.module:Class"):
        load_config(None, ["recommender.kind=svd"])


SETTINGS = ["activity.pareto_xmin=1", "agents=4", "graph.mean_degree=2", "memory.reflect_every=2"]
CORNAC = [
    "recommender.kind=agents.sandbox.recsys:CornacRecommender",
    "recommender.options={model: BPR, params: {k: 8, max_iter: 20}}",
]


def args(raw, out, rounds, *extra):
    return argparse.Namespace(
        config=None, out=str(out), rounds=rounds, agents=None, human=None, overwrite=False,
        set=[f"data={raw / 'movielens_latest_small'}", *SETTINGS, *extra],
    )  # fmt: skip


def browsed(out):
    rows = [json.loads(line) for line in (out / "interactions.jsonl").read_text().splitlines()]
    return [r["items"] for r in rows if r["action"] == "browse"]


@pytest.mark.slow
def test_cornac_recommends_in_a_real_run_and_resumes_exactly(raw, tmp_path):
    straight = run(args(raw, tmp_path / "straight", 3, *CORNAC), Recording(), embed)
    assert not [k for k in straight["counts"] if k.startswith("recommender_refused")]
    assert straight["recommender_plugin"]["target"] == "agents.sandbox.recsys:CornacRecommender"
    assert browsed(tmp_path / "straight")  # agents browsed Cornac's pages
    popular = run(args(raw, tmp_path / "popular", 3, "recommender.kind=popularity"), Recording(), embed)
    assert browsed(tmp_path / "straight") != browsed(tmp_path / "popular")  # BPR's pages are its own
    run(args(raw, tmp_path / "stopped", 2, *CORNAC), Recording(), embed)
    run(args(raw, tmp_path / "stopped", 3, *CORNAC), Recording(), embed)
    assert browsed(tmp_path / "stopped") == browsed(tmp_path / "straight")
    assert popular["recommender_plugin"] is None


@pytest.mark.slow
def test_a_changed_recommender_file_refuses_the_resume(raw, tmp_path, plugin):
    run(args(raw, tmp_path / "run", 1, f"recommender.kind={plugin}"), Recording(), embed)
    path = plugin.rsplit(":", 1)[0]
    with open(path, "a") as handle:
        handle.write("\n# retrained differently\n")
    with pytest.raises(SystemExit, match="changed: recommender_plugin"):
        run(args(raw, tmp_path / "run", 2, f"recommender.kind={plugin}"), Recording(), embed)


# -- branches and export ----------------------------------------------------------------------------------


def lines(path):
    return path.read_text().splitlines()


@pytest.mark.slow
def test_two_forks_with_no_change_are_identical_round_by_round_and_a_change_shows_in_compare(raw, tmp_path):
    from agents.sandbox.branches import compare, fork

    run(args(raw, tmp_path / "trunk", 2, "recommender.kind=popularity"), Recording(), embed)
    for name in ("b", "c"):
        record = fork(tmp_path / "trunk", 1, tmp_path / name)
        assert record["round"] == 1 and record["changed"] == []
    assert lines(tmp_path / "b" / "stats.jsonl") == lines(tmp_path / "trunk" / "stats.jsonl")[:1]
    for name in ("b", "c"):
        branch = argparse.Namespace(
            config=str(tmp_path / name / "config.json"), out=str(tmp_path / name), rounds=4, agents=None,
            human=None, overwrite=False, set=[],
        )  # fmt: skip
        run(branch, Recording(), embed)
    for name in ("interactions.jsonl", "stats.jsonl"):
        assert lines(tmp_path / "b" / name) == lines(tmp_path / "c" / name)
    # the trunk continued from its own checkpoint goes the same way: the fork carried every seed
    run(args(raw, tmp_path / "trunk", 4, "recommender.kind=popularity"), Recording(), embed)
    assert lines(tmp_path / "trunk" / "stats.jsonl") == lines(tmp_path / "b" / "stats.jsonl")
    same = compare(tmp_path / "b", tmp_path / "c")
    assert same["rounds"] == [2, 3, 4] and all(v["difference"] == 0 for v in same["statistics"].values())

    record = fork(tmp_path / "trunk", 1, tmp_path / "random", ["recommender.kind=random"])
    assert record["changed"] == ["config.recommender.kind"]
    branch = argparse.Namespace(
        config=str(tmp_path / "random" / "config.json"), out=str(tmp_path / "random"), rounds=4, agents=None,
        human=None, overwrite=False, set=[],
    )  # fmt: skip
    run(branch, Recording(), embed)
    assert lines(tmp_path / "random" / "stats.jsonl")[:1] == lines(tmp_path / "b" / "stats.jsonl")[:1]
    differ = compare(tmp_path / "b", tmp_path / "random", tmp_path / "cmp")
    assert differ["after_round"] == 1 and (tmp_path / "cmp" / "compare.md").exists()
    assert differ["statistics"]["exposure_genre_entropy"]["difference"] != 0
    assert all("p_holm" in v for v in differ["statistics"].values() if v["p"] is not None)
    with pytest.raises(SystemExit, match="not empty"):
        fork(tmp_path / "trunk", 1, tmp_path / "b")
    with pytest.raises(SystemExit, match="no checkpoint of round 9"):
        fork(tmp_path / "trunk", 9, tmp_path / "late")


@pytest.mark.slow
def test_an_export_trains_cornac_and_reads_back_as_recbole_atomic_files(raw, tmp_path):
    import csv

    from cornac.data import Dataset
    from cornac.models import BPR

    from agents.sandbox.export import export

    run(args(raw, tmp_path / "run", 3, *CORNAC), Recording(), embed)
    with open(tmp_path / "run" / "interactions.jsonl", "a") as handle:  # a round a kill cut off
        handle.write(json.dumps({"round": 4, "agent": "x", "action": "watch", "item": 1}) + "\n")
    only_watches = list(csv.DictReader(open(export(tmp_path / "run", "csv", tmp_path / "watches"))))
    assert {r["action"] for r in only_watches} == {"watch"}  # what a library may read as positives
    table = export(tmp_path / "run", "csv", impressions=True)
    rows = list(csv.DictReader(open(table)))
    assert len(only_watches) == sum(r["action"] == "watch" for r in rows) and {r["round"] for r in rows} <= {
        "1",
        "2",
        "3",
    }
    watches = [r for r in rows if r["action"] == "watch"]
    events = [json.loads(line) for line in lines(tmp_path / "run" / "interactions.jsonl")]
    assert len(watches) == sum(e["action"] == "watch" and e["round"] <= 3 for e in events) > 0
    assert all(r["rating"] for r in watches) and not any(r["rating"] for r in rows if r["action"] != "watch")
    start = json.loads((tmp_path / "run" / "checkpoint.json").read_text())["start"]
    assert {int(r["timestamp"]) - start for r in rows} <= {86400 * k for k in (1, 2, 3)}
    data = Dataset.from_uir([(r["user_id"], r["item_id"], 1.0) for r in only_watches], seed=0)
    model = BPR(k=4, max_iter=5, seed=0, verbose=False)
    model.fit(data)  # the library trains on simulated behaviour
    assert model.score(0).shape == (data.num_items,)

    inter = export(tmp_path / "run", "recbole", tmp_path / "atomic" / "sim", impressions=True)
    header, *body = lines(inter)
    assert header.split("\t") == [
        "user_id:token", "item_id:token", "rating:float", "timestamp:float", "round:float", "action:token",
    ]  # fmt: skip
    assert len(body) == len(rows) and all(len(line.split("\t")) == 6 for line in body)
    items = {line.split("\t")[0] for line in lines(tmp_path / "atomic" / "sim" / "sim.item")[1:]}
    assert items == {r["item_id"] for r in rows}


def recbole_read(path):
    """An atomic file read as RecBole 1.2's Dataset._load_feat reads it: the header's field:type names,
    pandas' CSV reader with a tab delimiter and the python engine (default quoting), floats as float64
    and the rest as text."""
    import numpy as np
    import pandas as pd

    fields = path.read_text(encoding="utf-8").split("\n", 1)[0].split("\t")
    dtype = {f: np.float64 if f.endswith(":float") else str for f in fields}
    frame = pd.read_csv(path, delimiter="\t", usecols=fields, dtype=dtype, encoding="utf-8", engine="python")
    frame.columns = [f.split(":")[0] for f in fields]
    return frame


def test_recbole_files_quote_what_recboles_reader_would_misread(tmp_path):
    """A MovieLens title that starts with a double quote (there are such in ml-latest-small), one with a
    quote inside and one with a tab: each reads back as written, and every row keeps its columns."""
    from types import SimpleNamespace

    from agents.sandbox.export import write_recbole

    titles = {1: '"Great Performances" Cats (1998)', 2: 'The "Best" Film (2001)', 3: "Tab\tin title (1990)"}
    movies = {i: SimpleNamespace(title=t, genres=["Comedy", "Film-Noir"]) for i, t in titles.items()}
    rows = [{"user_id": 5, "item_id": i, "rating": 4.0 if i != 2 else None, "timestamp": 86400 * i, "round": i,
             "action": "watch" if i != 2 else "browse"} for i in titles]  # fmt: skip
    out = tmp_path / "sim"
    out.mkdir()
    inter = write_recbole(out, rows, movies)
    items = recbole_read(out / "sim.item")
    assert items["title"].tolist() == [
        '"Great Performances" Cats (1998)',
        'The "Best" Film (2001)',
        "Tab in title (1990)",
    ]
    assert (
        items["item_id"].tolist() == ["1", "2", "3"] and items["genres"].tolist() == ["Comedy Film-Noir"] * 3
    )
    events = recbole_read(inter)
    assert events["action"].tolist() == ["watch", "browse", "watch"] and events["rating"].isna().tolist() == [
        False,
        True,
        False,
    ]
    assert (
        (tmp_path / "sim" / "sim.item").read_text().splitlines()[1].startswith('1\t"""Great Performances""')
    )


def test_a_cornac_model_whose_framework_is_missing_is_refused_by_name():
    import importlib.util
    from types import SimpleNamespace

    import numpy as np

    from agents.sandbox.recsys import CornacRecommender

    rng = np.random.default_rng(0)
    assert importlib.util.find_spec("tensorflow") is None  # this environment, as shipped
    for model, params in (("WMF", {}), ("NeuMF", {}), ("CDL", {})):
        with pytest.raises(ValueError, match="needs tensorflow, which is not installed"):
            CornacRecommender([1, 2], rng, SimpleNamespace(options={"model": model, "params": params}))
    for model, params in (("BPR", {}), ("NeuMF", {"backend": "pytorch"}), ("VAECF", {})):  # torch is here
        CornacRecommender([1, 2], rng, SimpleNamespace(options={"model": model, "params": params}))
