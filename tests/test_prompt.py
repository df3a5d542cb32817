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
