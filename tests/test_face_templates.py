"""app/faces/templates.py and the Matrix's search through it: the same face and the same float as an exhaustive
search computed independently (exact rational arithmetic), on galleries built for ties, near-ties, imperfect
norms and clustered people; the bound never below a face's similarity; and the templates used when they pay."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from app.faces import templates as templates_module
from app.faces.matrix import Matrix
from app.faces.templates import BACKOFF_MAX, CANDIDATE_SHARE, Templates, exact_similarity, rounding

DIMENSION = 32


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def people(rng, count, faces, spread, dimension=DIMENSION):
    """`count` people with `faces` faces each around a centre: spread 0 puts a person's faces on their centre,
    1 makes them independent."""
    centres = unit(rng.standard_normal((count, dimension)))
    noise = unit(rng.standard_normal((count, faces, dimension)))
    return unit(np.sqrt(1 - spread) * centres[:, None] + np.sqrt(spread) * noise), centres


def matrix_of(vectors: np.ndarray, owners: np.ndarray | None = None) -> Matrix:
    """A Matrix of [people, faces, D] vectors (or [rows, D] with owners), rows given person by person, shuffled."""
    if owners is None:
        count, faces = vectors.shape[:2]
        owners = np.repeat(np.arange(count), faces)
        vectors = vectors.reshape(count * faces, -1)
    order = np.random.default_rng(0).permutation(len(owners))
    return Matrix("e" * 64, vectors.shape[1], np.ascontiguousarray(vectors[order]), owners[order].astype(np.int32),
                  tuple(f"person-{i}" for i in range(int(owners.max()) + 1)))


def exhaustive(matrix: Matrix, query: np.ndarray) -> tuple[str, float]:
    """The nearest face by exact rational arithmetic over every row (ties: the first row), as (userid, float);
    over 200 rows by exact_similarity (correctly rounded, checked against the rationals below)."""
    if len(matrix.vectors) > 200:
        values = [exact_similarity(vector, query) for vector in matrix.vectors]
        best_row = int(np.argmax(values))  # the first of the greatest
        return matrix.userids[matrix.owners[best_row]], values[best_row]
    q = [Fraction(float(v)) for v in query]
    best_row, best = None, None
    for row, vector in enumerate(matrix.vectors):
        value = sum(Fraction(float(a)) * b for a, b in zip(vector, q))
        if best is None or value > best:
            best_row, best = row, value
    return matrix.userids[matrix.owners[best_row]], float(best)


@pytest.fixture
def always_templates(monkeypatch):
    monkeypatch.setattr(templates_module, "TEMPLATE_MIN_BYTES", 0)


def test_the_exact_similarity_is_correctly_rounded():
    rng = np.random.default_rng(1)
    a, b = unit(rng.standard_normal(DIMENSION)), unit(rng.standard_normal(DIMENSION))
    exact = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b))
    assert exact_similarity(a, b) == float(exact)
    assert exact_similarity(a, b) == exact_similarity(a[::-1].copy(), b[::-1].copy())  # any order


@pytest.mark.parametrize("spread", [0.0, 0.25, 0.5, 1.0])
def test_the_bound_is_never_below_a_faces_similarity(spread):
    rng = np.random.default_rng(2)
    vectors, centres = people(rng, 40, 5, spread)
    # norms off by up to 1e-3, as the gallery lets them be
    vectors = (vectors * rng.uniform(0.999, 1.001, vectors.shape[:2])[..., None]).astype(np.float32)
    templates = Templates(vectors.reshape(-1, DIMENSION), np.full(40, 5))
    opposite = -templates.templates[:5]  # c = -1: where the cone is steepest
    queries = np.concatenate([unit(rng.standard_normal((30, DIMENSION))), centres[:10], vectors[:10, 0],
                              -centres[:5], opposite]) * rng.uniform(0.999, 1.001, (60, 1))
    for query in queries.astype(np.float32):
        bounds = templates.bounds(templates.templates @ query, float(np.linalg.norm(query.astype(np.float64))))
        for person in range(40):
            best = max(exact_similarity(face, query) for face in vectors[person])
            assert bounds[person] >= best


@pytest.mark.parametrize("spread", [0.1, 0.25, 0.5, 1.0])
def test_the_search_is_the_exhaustive_one(always_templates, monkeypatch, spread):
    rng = np.random.default_rng(3)
    vectors, centres = people(rng, 60, 3, spread)
    matrix = matrix_of(vectors)
    assert matrix.templates is not None
    paths = []
    candidates = Templates.candidates

    def counted(self, *args):
        rows = candidates(self, *args)
        paths.append("whole" if rows is None else "some")
        return rows

    monkeypatch.setattr(Templates, "candidates", counted)
    known = unit(np.sqrt(0.7) * centres[:20] + np.sqrt(0.3) * unit(rng.standard_normal((20, DIMENSION))))
    queries = np.concatenate([known, unit(rng.standard_normal((20, DIMENSION))), vectors[:5, 1]])
    for query in queries:
        (match,) = matrix.best(query)
        assert (match.userid, match.similarity) == exhaustive(matrix, query)
    batch = matrix.best(queries)
    assert batch == [matrix.best(query)[0] for query in queries]
    if spread <= 0.25:  # people whose faces agree: a registered face's search reads a few of them
        assert paths[:20].count("some") >= 15


@pytest.mark.parametrize("step", ["down", "up"])
def test_ties_go_to_the_first_row_and_near_ties_to_the_exact_greater(always_templates, step):
    """People 5 and 20 hold the query itself; person 11 holds it with one value one float32 step from it,
    towards zero (a hair less similar: the tie between 5 and 20 decides) or away (a hair more: 11 wins)."""
    rng = np.random.default_rng(4)
    vectors, _ = people(rng, 30, 3, 0.3)
    query = unit(rng.standard_normal(DIMENSION))
    vectors[5, 0] = vectors[20, 2] = vectors[11, 1] = query
    away = np.float32(2) if query[3] > 0 else np.float32(-2)
    vectors[11, 1, 3] = np.nextafter(query[3], away if step == "up" else -away)
    matrix = matrix_of(vectors)
    (match,) = matrix.best(query)
    assert (match.userid, match.similarity) == exhaustive(matrix, query)
    if step == "up":
        assert match.userid == "person-11"
    else:
        first = min(row for row in range(len(matrix.owners)) if matrix.owners[row] in (5, 20))
        assert match.userid == matrix.userids[matrix.owners[first]]
    assert matrix.ranked(query, 3)[0] == match


def test_the_templates_skip_most_people_for_a_registered_face_and_none_for_a_stranger(always_templates):
    rng = np.random.default_rng(5)
    vectors, centres = people(rng, 400, 3, 0.25, dimension=128)
    matrix = matrix_of(vectors)
    known = unit(np.sqrt(0.75) * centres[7] + np.sqrt(0.25) * unit(rng.standard_normal(128)))
    template_scores = matrix.templates.templates @ known
    rows = matrix.templates.candidates(template_scores, known, matrix.vectors)
    assert rows is not None and len(rows) < 0.05 * len(matrix.vectors) and 7 in set(matrix.owners[rows])
    assert matrix.best(known)[0].userid == "person-7"
    stranger = unit(rng.standard_normal(128))
    assert matrix.templates.candidates(matrix.templates.templates @ stranger, stranger, matrix.vectors) is None
    assert CANDIDATE_SHARE < 1


def test_templates_are_kept_for_large_matrices_of_several_faces_a_person():
    rng = np.random.default_rng(6)
    one_face = unit(rng.standard_normal((20_000, 128)))
    assert Templates.worth(one_face, np.ones(20_000, int)) is False      # one face a person: the faces themselves
    three = np.full(6_667, 3)
    three[-1] = 2
    assert Templates.worth(one_face, three) is True                      # 3 faces a person, 10 MB
    assert Templates.worth(one_face[:3000], np.full(1000, 3)) is False   # 1.5 MB: in the caches
    three[5] = 0
    assert Templates.worth(one_face, three) is False                     # a person without a face: not grouped


def test_faces_that_cancel_out_leave_their_person_always_a_candidate(always_templates):
    face = unit(np.random.default_rng(7).standard_normal(DIMENSION))
    vectors = np.stack([face, -face, face, face])
    matrix = matrix_of(vectors, np.array([0, 0, 1, 1]))
    assert matrix.templates.cos[0] <= -1.0  # every query within its cone: bound 1
    (match,) = matrix.best(-face)
    assert (match.userid, match.similarity) == exhaustive(matrix, -face)


def test_rounding_grows_with_the_dimension():
    assert rounding(128) == pytest.approx(1.01 * 128 * 2 ** -24 * 1.003)
    assert rounding(512) == 4 * rounding(128)


def test_after_a_search_the_templates_did_not_pay_for_the_next_ones_read_everything(always_templates, monkeypatch):
    """Strangers in a row: templates tried on 1 search in 1 + 1, then 1 + 2, ... 1 + BACKOFF_MAX; a registered
    face they answer starts over. The answers are the exhaustive ones throughout."""
    rng = np.random.default_rng(8)
    vectors, centres = people(rng, 300, 3, 0.25, dimension=128)
    matrix = matrix_of(vectors)
    tried = []
    candidates = Templates.candidates

    def counted(self, *args):
        tried.append(tried_before[-1])
        return candidates(self, *args)

    tried_before: list[int] = []
    monkeypatch.setattr(Templates, "candidates", counted)
    strangers = unit(rng.standard_normal((80, 128)))
    for index, query in enumerate(strangers):
        tried_before.append(index)
        (match,) = matrix.best(query)
        assert (match.userid, match.similarity) == exhaustive(matrix, query)
    # tried at searches 0, 2, 5, 10, 19, 36, 53, 70: gaps of 1, 2, 4, 8, 16, 16, 16 searches read whole
    assert tried == [0, 2, 5, 10, 19, 36, 53, 70]
    known = unit(np.sqrt(0.8) * centres[3] + np.sqrt(0.2) * unit(rng.standard_normal(128)))
    for index in range(80, 97):  # the rest of the backoff (to 86), then the templates again: they pay
        tried_before.append(index)
        assert matrix.best(known)[0].userid == "person-3"
    assert tried[8:] == list(range(87, 97))  # 71-86 read whole; from 87 on they pay, and are tried every time
    assert matrix.templates.paid == 10
    assert BACKOFF_MAX == 16
