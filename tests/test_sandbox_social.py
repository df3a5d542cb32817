"""Activity and the social graph: the Pareto fit recovers a known alpha, the graph file's bad edges
are named, generated graphs follow their degree and homophily."""

import numpy as np
import pytest

from agents.sandbox.social import GraphError, activity_levels, fit_pareto, generate_graph, load_edges


def test_the_pareto_fit_recovers_a_known_alpha_and_says_when_the_law_does_not_fit():
    rng = np.random.default_rng(0)
    sample = 20 * (1 + rng.pareto(1.5, size=5000))  # classical Pareto, alpha 1.5, x_min 20
    fit = fit_pareto(sample)
    assert fit["alpha"] == pytest.approx(1.5, abs=0.06) and fit["ks_statistic"] < 0.02
    uniform = rng.uniform(20, 40, size=5000)
    assert fit_pareto(uniform)["ks_statistic"] > 0.1  # not a power law: a large distance


def test_activity_levels_are_probabilities_drawn_from_the_run_generator():
    levels = activity_levels(1000, 1.5, 0.1, np.random.default_rng(0))
    assert levels.min() >= 0.1 and levels.max() <= 1.0
    assert np.array_equal(levels, activity_levels(1000, 1.5, 0.1, np.random.default_rng(0)))


def test_a_graph_file_with_an_unknown_agent_names_the_row(tmp_path):
    path = tmp_path / "edges.csv"
    path.write_text("a,b\nAna,Bo\nBo,Cy\n")
    with pytest.raises(GraphError, match=r"edges\.csv row 3: unknown agent 'Cy'"):
        load_edges(path, ["Ana", "Bo"])
    path.write_text("a,b\nAna,Bo\n")
    assert load_edges(path, ["Ana", "Bo"]) == {"Ana": {"Bo"}, "Bo": {"Ana"}}


def test_generated_graphs_follow_degree_and_homophily():
    names = [f"a{i}" for i in range(40)]
    interests = [["Comedy"] if i % 2 else ["Horror"] for i in range(40)]

    def shared_share(graph):
        edges = {tuple(sorted((a, b))) for a in graph for b in graph[a]}
        same = sum(interests[int(a[1:])] == interests[int(b[1:])] for a, b in edges)
        return len(edges), same / len(edges)

    edges, random_share = shared_share(generate_graph(names, interests, 4, 0.0, np.random.default_rng(0)))
    assert edges == 80 and 0.3 < random_share < 0.7  # about half the pairs share an interest
    edges, homophilous = shared_share(generate_graph(names, interests, 4, 1.0, np.random.default_rng(0)))
    assert edges == 80 and homophilous == 1.0
