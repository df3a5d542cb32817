"""The answer format's parser, on the shapes small models actually write."""

import pytest

from data_prep.prompt import format_completion, parse_completion


@pytest.mark.parametrize(
    ("text", "stars", "review"),
    [
        ("stars: 4\nreview: Great tacos.", 4.0, "Great tacos."),
        ("Stars: 4\nReview: Great tacos.", 4.0, "Great tacos."),
        ("rating: 4.5\nreview: Good.", 4.5, "Good."),
        ("stars: four\nreview: Good value.", 4.0, "Good value."),
        ("I give it 4 stars.\nreview: Fine.", 4.0, "Fine."),
        ("Four stars out of 5\nreview: Fine.", 4.0, "Fine."),
        ("stars: **5**\nreview: Loved it", 5.0, "Loved it"),
        ("stars: 9\nreview: Too many stars.", 9.0, "Too many stars."),  # returned as is: the caller decides
        ("stars: 0\nreview: None at all.", 0.0, "None at all."),
        ("stars: 3\nreview: Okay.\nstars: 5\nreview: again", 3.0, "Okay."),  # restarts: the first answer
        ("stars: 2\nreview: Slow.\nRating: 4", 2.0, "Slow."),
        ("stars: 5", 5.0, None),  # no review
        ("review: Nice place.", None, "Nice place."),  # no stars
        ("stars: lots\nreview: x", None, "x"),  # unreadable stars
        ("stars: 4\nreview:   ", 4.0, None),  # an empty review is no review
        ("The user would like it.", None, None),
    ],
)
def test_parse_completion(text, stars, review):
    assert parse_completion(text) == (stars, review)


def test_format_and_parse_round_trip():
    for stars, review in ((4.0, "Good."), (3.5, "Half a star short.\nSecond line.")):
        assert parse_completion(format_completion(stars, review)) == (stars, review)


# -- fitting a prompt to its budget: the user's reviews go last ------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from data_prep.offline_models import smollm2_offline

    return AutoTokenizer.from_pretrained(smollm2_offline())


def review(rid, date, text, stars=4):
    return {"review_id": rid, "date": date, "text": text, "stars": stars}


LONG = " ".join(f"word{i}" for i in range(200))
ITEM = {
    "title": "A gift card for a cinema",
    "category": "Gift_Cards",
    "description": "Popcorn and films. " * 40,
}


def test_a_long_description_and_a_long_review_are_cut_before_the_users_review_is_dropped(tokenizer):
    """At a demo-sized budget the old fitter dropped whole reviews, the user's first on a tie, while the
    item's long description stayed whole: this prompt showed none of the user's reviews."""
    from data_prep.prompt import count_tokens, fit_messages

    user = [review("u1", "2018-01-01", LONG), review("u2", "2018-02-01", "Great value, used it twice.")]
    item = [review("i1", "2018-01-05", LONG, 5)]
    fitted = fit_messages(tokenizer, None, user, ITEM, item, 256, "stars: 4\nreview: Good.")
    prompt = fitted.messages[-1]["content"]
    assert len(fitted.user_reviews) == 2 and fitted.shown == "2+"  # both of the user's reviews shown
    assert "Great value, used it twice." in prompt and "word0 word1" in prompt
    assert fitted.cuts[0] == "item description"  # cut first, by tokens, marked
    assert "description: Popcorn" in prompt and "…" in prompt.split("description: ")[1].splitlines()[0]
    assert (
        count_tokens(tokenizer, fitted.messages, "stars: 4\nreview: Good.") == fitted.tokens["total"] <= 256
    )
    parts = ("frame", "user_reviews", "item", "item_reviews", "completion")
    assert sum(fitted.tokens[p] for p in parts) == fitted.tokens["total"]


def test_the_users_last_review_goes_only_when_no_item_text_is_left(tokenizer):
    from data_prep.prompt import MIN_REVIEW_TOKENS, fit_messages

    user = [review("u1", "2018-01-01", LONG), review("u2", "2018-02-01", LONG)]
    item = [review("i1", "2018-01-05", LONG, 5), review("i2", "2018-01-06", LONG, 1)]
    completion = "stars: 2\nreview: " + " ".join(["meh"] * 60)
    seen = []
    for budget in range(400, 100, -10):
        try:
            fitted = fit_messages(tokenizer, None, user, ITEM, item, budget, completion)
        except ValueError:
            break
        seen.append(fitted)
        content = fitted.messages[-1]["content"]
        if fitted.item_reviews:  # the item's reviews are dropped before any of the user's
            assert len(fitted.user_reviews) == 2
        if not fitted.user_reviews:  # the user's last review went: nothing of the item is left
            assert "title:" not in content and "description:" not in content
            assert "Their 2 past reviews did not fit here." in content  # never "none are known"
        for r in fitted.user_reviews + fitted.item_reviews:
            assert len(tokenizer(r["text"].rstrip("…"))["input_ids"]) >= min(MIN_REVIEW_TOKENS, 4)
        if fitted.user_reviews:
            assert fitted.user_reviews[-1]["review_id"] == "u2"  # the latest is kept longest
    assert seen[-1].shown == "0"  # at the very end only: the loop checked that no item text was left
    assert {f.shown for f in seen} >= {"2+", "1"}
