"""A maintained recommender library in the sandbox: any Cornac model behind the recommender protocol
(agents/sandbox/recommender.py).

    recommender:
      kind: agents.sandbox.recsys:CornacRecommender
      options: {model: BPR, params: {k: 32, max_iter: 100, learning_rate: 0.01}}

``model`` is the name of a class in ``cornac.models`` (BPR, WMF, MostPop, NeuMF, ...) and ``params``
its keyword arguments; the seed comes from the run's generator (or the checkpoint, on a resume), for
the models that take one. Cornac
fits on the (user, movie) clicks as implicit feedback (every click a 1). A movie nobody has clicked is
not in Cornac's data: it ranks after every scored one, by id. A user Cornac has not seen (an agent with
no click yet) gets the most clicked movies. A model that needs a framework not installed here (WMF and
CDL need TensorFlow; NeuMF too unless ``backend: pytorch``) is refused when the run starts, naming it.

Why Cornac: RecBole (what RecAgent used) 1.2.1, its latest release, sets ``np.float = np.float_`` when
a config is made, which NumPy 2 removed, and imports ray for its quick start; Cornac 3 installs and runs
with the project's NumPy and torch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

# the deep-learning frameworks Cornac models use; a model's folder lists what it needs in requirements.txt
FRAMEWORKS = {"tensorflow": "tensorflow", "torch": "torch", "pytorch": "torch", "dgl": "dgl"}


def missing_framework(model_class, params: dict) -> str | None:
    """The framework a Cornac model needs that is not installed, or None. A model with a ``backend``
    parameter (the NCF family: tensorflow or pytorch) needs the backend it is given (or its default);
    another needs every framework its folder's requirements.txt lists."""
    import importlib.util
    import inspect
    import re
    import sys

    signature = inspect.signature(model_class.__init__).parameters
    if "backend" in signature:
        chosen = str(params.get("backend", signature["backend"].default)).lower()
        needed = [FRAMEWORKS[chosen]] if chosen in FRAMEWORKS else []
    else:
        module = sys.modules[model_class.__module__]  # a Cython model (BPR) has a module file, not a source
        listed = Path(module.__file__).with_name("requirements.txt")
        names = re.findall(r"^\s*([A-Za-z0-9_.-]+)", listed.read_text(), re.M) if listed.exists() else []
        needed = [FRAMEWORKS[n.lower()] for n in names if n.lower() in FRAMEWORKS]
    return next((n for n in needed if importlib.util.find_spec(n) is None), None)


class CornacRecommender:
    def __init__(self, items: list[int], rng: np.random.Generator, config):
        import cornac.models

        options = dict(config.options)
        name = options.pop("model", "BPR")
        self.params = dict(options.pop("params", {}))
        if options:
            raise ValueError(f"CornacRecommender options: unknown {sorted(options)} (model, params)")
        self.model_class = getattr(cornac.models, name, None)
        if self.model_class is None:
            raise ValueError(f"cornac.models has no model {name!r}")
        missing = missing_framework(self.model_class, self.params)
        if missing:  # refused now: a fit that fails later would fall back to popularity, unseen
            raise ValueError(
                f"cornac {name} needs {missing}, which is not installed here (pip install {missing}), or "
                "choose a model without it (BPR, MF, MostPop, VAECF, or NeuMF with params: {backend: pytorch})"
            )
        self.name, self.items, self.rng = name, sorted(items), rng
        self.model, self.data, self.seed, self.popular = None, None, None, list(self.items)

    def fit(self, clicks: list[tuple[int, int]], seed: int | None = None) -> None:
        from cornac.data import Dataset

        self.seed = int(self.rng.integers(2**31 - 1)) if seed is None else seed
        counts = Counter(item for _, item in clicks)
        self.popular = sorted(self.items, key=lambda i: (-counts[i], i))
        pairs = sorted(set(clicks))  # one observation per (user, movie): Cornac drops repeats anyway
        self.data = Dataset.from_uir([(str(u), str(i), 1.0) for u, i in pairs], seed=self.seed)
        import inspect

        accepted = inspect.signature(self.model_class.__init__).parameters  # MostPop takes no seed
        extra = {k: v for k, v in (("seed", self.seed), ("verbose", False)) if k in accepted}
        self.model = self.model_class(**self.params, **extra)
        self.model.fit(self.data)
        self.item_ids = np.array([int(i) for i in self.data.item_ids])

    def rank(self, user: int, exclude: set[int], n: int) -> list[int]:
        uid = self.data.uid_map.get(str(user)) if self.data is not None else None
        if uid is None:
            order = self.popular
        else:
            scores = np.asarray(self.model.score(uid), dtype=np.float64)
            scored = self.item_ids[np.lexsort((self.item_ids, -scores))]  # best first, ties by id
            known = set(scored.tolist())
            order = [*scored.tolist(), *(i for i in self.items if i not in known)]
        out = []
        for item in order:
            if item not in exclude:
                out.append(item)
                if len(out) == n:
                    break
        return out
