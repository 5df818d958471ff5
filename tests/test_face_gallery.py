"""The face gallery's API (app/faces/): registration, search, listing, re-embedding, where it lives, and every
bad input answered with a typed error that says what was wrong and leaves the gallery as it was."""

from __future__ import annotations

import ast
import io
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from app.errors import ServeError
from app.faces import (FACES_PER_PERSON_MAX, DimensionMismatch, FaceRegion, ForeignDatabase, Gallery, GalleryError,
                       InvalidEmbedderId, InvalidFace, InvalidUserId, InvalidVector, Matrix, NewFace, TooManyFaces,
                       UnknownEmbedder, UnknownUser, check_userid, cut_region, default_data_dir,
                       default_gallery_path, reembed)
from app.faces.regions import FACE_MAX_PX, REGION_SCALE, check_region
from app.faces.schema import APPLICATION_ID
from tests.conftest import ROOT
from tests.face_gallery_people import (DIMENSION, EMBEDDER_A, EMBEDDER_B, embed_b, face_region, faces_of,
                                       key_vector, unit_vector)


@pytest.fixture
def gallery(tmp_path):
    with Gallery(tmp_path / "data" / "faces.db") as gallery:
        yield gallery


def test_a_registered_face_is_found_by_its_vector_and_the_nearest_person_wins(gallery):
    gallery.register("ann", faces_of("ann", 0, 2), EMBEDDER_A)
    gallery.register("bob", faces_of("bob", 0, 1), EMBEDDER_A)
    (match,) = gallery.search(EMBEDDER_A, key_vector("ann", 0, 1))
    assert match.userid == "ann" and match.similarity == pytest.approx(1.0, abs=1e-6)
    near_bob = key_vector("bob", 0, 0) * 0.9 + unit_vector(7) * 0.1
    matches = gallery.search(EMBEDDER_A, np.stack([near_bob / np.linalg.norm(near_bob), key_vector("ann", 0, 0)]))
    assert [m.userid for m in matches] == ["bob", "ann"]
    assert matches[0].similarity == pytest.approx(float(key_vector("bob", 0, 0) @ (near_bob / np.linalg.norm(near_bob))),
                                                  abs=1e-6)


def test_a_search_sees_only_its_embedder_s_vectors(gallery):
    gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
    assert gallery.search(EMBEDDER_B, key_vector("ann", 0, 0)) == [None]
    assert len(gallery.matrix(EMBEDDER_B)) == 0 and len(gallery.matrix(EMBEDDER_A)) == 1
    coverage = gallery.coverage(EMBEDDER_B)
    assert coverage.missing == ("ann",) and not coverage.complete and coverage.embedded_faces == 0


def test_adding_a_face_the_person_holds_already_adds_nothing(gallery):
    """A client training the same photo again (Double Take's sync, Viseron's retrain at start) does not grow the
    gallery: a face whose region and vector are the same bytes as one the person holds, or as another of the same
    request, is counted as held, not added. The same region with another vector is another face."""
    gallery.register("ann", faces_of("ann", 0, 2), EMBEDDER_A)
    again = gallery.register("ann", faces_of("ann", 0, 2) + faces_of("ann", 5, 1) + faces_of("ann", 5, 1),
                             EMBEDDER_A, replace=False)
    assert (again.added, again.held, again.replaced, again.faces) == (1, 3, 0, 3)
    assert len(gallery.faces("ann")) == 3
    nothing_new = gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A, replace=False)
    assert (nothing_new.added, nothing_new.held, nothing_new.faces) == (0, 1, 3)
    gallery.register("bob", faces_of("ann", 0, 1), EMBEDDER_A, replace=False)  # another person's: theirs to hold
    assert len(gallery.faces("bob")) == 1
    region = faces_of("ann", 0, 1)[0].region
    other_vector = NewFace(region, faces_of("ann", 7, 1)[0].vector)
    assert gallery.register("ann", [other_vector], EMBEDDER_A, replace=False).added == 1


def test_register_replaces_by_default_as_deepstack_does_and_adds_when_asked(gallery):
    first = gallery.register("ann", faces_of("ann", 0, 2), EMBEDDER_A)
    assert (first.created, first.added, first.replaced, first.faces) == (True, 2, 0, 2)
    again = gallery.register("ann", faces_of("ann", 1, 1), EMBEDDER_A)
    assert (again.created, again.added, again.replaced, again.faces, again.erased) == (False, 1, 2, 1, True)
    assert gallery.search(EMBEDDER_A, key_vector("ann", 0, 0))[0].similarity < 0.9  # the old faces are gone
    more = gallery.register("ann", faces_of("ann", 2, 3), EMBEDDER_A, replace=False)
    assert (more.added, more.replaced, more.faces) == (3, 0, 4)
    assert [face.region.image for face in gallery.faces("ann")] == \
        [face.region.image for face in faces_of("ann", 1, 1) + faces_of("ann", 2, 3)]


def test_userids_are_exact_and_case_sensitive(gallery):
    gallery.register("Ann", faces_of("Ann", 0, 1), EMBEDDER_A)
    gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
    gallery.register("Zoë 🙂", faces_of("Zoë", 0, 1), EMBEDDER_A)
    assert gallery.userids() == ["Ann", "ann", "Zoë 🙂"]
    gallery.delete("ann")
    assert gallery.userids() == ["Ann", "Zoë 🙂"]
    assert gallery.search(EMBEDDER_A, key_vector("Zoë", 0, 0))[0].userid == "Zoë 🙂"


def test_people_lists_faces_and_vectors_per_embedder(gallery):
    gallery.register("ann", faces_of("ann", 0, 2), EMBEDDER_A)
    gallery.register("bob", faces_of("bob", 0, 1), EMBEDDER_A)
    reembed(gallery, EMBEDDER_B, embed_b)
    people = gallery.people()
    assert [(p.userid, p.faces, p.embedded) for p in people] == [
        ("ann", 2, {EMBEDDER_A: 2, EMBEDDER_B: 2}), ("bob", 1, {EMBEDDER_A: 1, EMBEDDER_B: 1})]
    assert [(e.sha256, e.dimension, e.vectors) for e in gallery.embedders()] == [
        (EMBEDDER_A, DIMENSION, 3), (EMBEDDER_B, DIMENSION, 3)]


def test_reembedding_makes_the_new_embedder_s_vectors_from_the_regions_and_keeps_the_old(gallery):
    for userid in ("ann", "bob", "cy"):
        gallery.register(userid, faces_of(userid, 0, 2), EMBEDDER_A)
    done = reembed(gallery, EMBEDDER_B, embed_b, batch=4)
    assert (done.stored, done.missing) == (6, ())
    for face in gallery.faces("bob"):
        assert gallery.search(EMBEDDER_B, embed_b(face.region))[0].userid == "bob"
    assert gallery.search(EMBEDDER_A, key_vector("cy", 0, 1))[0].userid == "cy"
    assert reembed(gallery, EMBEDDER_B, embed_b).stored == 0  # nothing left to do
    assert gallery.forget_embedder(EMBEDDER_A) == 6
    assert gallery.search(EMBEDDER_A, key_vector("cy", 0, 1)) == [None]
    assert gallery.coverage(EMBEDDER_A).missing == ("ann", "bob", "cy")
    with pytest.raises(UnknownEmbedder):
        gallery.forget_embedder(EMBEDDER_A)


def test_a_face_registered_under_the_old_embedder_during_a_reembedding_is_reported_then_done(gallery):
    gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
    reembed(gallery, EMBEDDER_B, embed_b)
    gallery.register("late", faces_of("late", 0, 1), EMBEDDER_A)  # a process still on the old model
    assert gallery.coverage(EMBEDDER_B).missing == ("late",)
    assert reembed(gallery, EMBEDDER_B, embed_b).missing == ()


def test_add_vectors_skips_a_deleted_face_and_keeps_an_existing_vector(gallery):
    gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
    (face,) = gallery.faces("ann")
    assert gallery.add_vectors(EMBEDDER_A, {face.face_id: unit_vector(1)}) == 0  # has one: kept
    assert gallery.search(EMBEDDER_A, key_vector("ann", 0, 0))[0].similarity == pytest.approx(1.0, abs=1e-6)
    gallery.delete("ann")
    assert gallery.add_vectors(EMBEDDER_B, {face.face_id: unit_vector(1)}) == 0
    gallery.register("bob", faces_of("bob", 0, 1), EMBEDDER_A)
    assert gallery.faces("bob")[0].face_id != face.face_id  # ids are never reused


def test_ranked_gives_the_k_nearest_people_each_once_by_their_best_face(gallery):
    for index in range(30):
        gallery.register(f"p{index}", faces_of(f"p{index}", 0, 1 + index % 4), EMBEDDER_A)
    query = unit_vector(99)
    ranked = gallery.matrix(EMBEDDER_A).ranked(query, 5)
    best = {}
    for index in range(30):
        best[f"p{index}"] = max(float(key_vector(f"p{index}", 0, j) @ query) for j in range(1 + index % 4))
    expected = sorted(best.items(), key=lambda item: -item[1])[:5]
    assert [(m.userid, round(m.similarity, 5)) for m in ranked] == [(u, round(s, 5)) for u, s in expected]
    assert ranked[0] == gallery.search(EMBEDDER_A, query)[0]
    assert len(gallery.matrix(EMBEDDER_A).ranked(query, 100)) == 30


def test_the_matrix_is_read_again_only_after_a_commit(gallery):
    gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
    matrix = gallery.matrix(EMBEDDER_A)
    gallery.search(EMBEDDER_A, key_vector("ann", 0, 0))
    assert gallery.matrix(EMBEDDER_A) is matrix
    gallery.register("bob", faces_of("bob", 0, 1), EMBEDDER_A)
    assert gallery.matrix(EMBEDDER_A) is not matrix and len(gallery.matrix(EMBEDDER_A)) == 2


def test_an_empty_matrix_answers_none_and_checks_the_query():
    empty = Matrix.from_rows(EMBEDDER_A, None, ())
    assert empty.best(unit_vector(1)) == [None] and empty.ranked(unit_vector(1), 3) == []
    with pytest.raises(InvalidVector):
        empty.best(np.ones(8, np.float32))


# --- the region around a face ---------------------------------------------------------------------------------

def _photo(width: int, height: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    return Image.fromarray(np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8))


def test_the_region_is_a_square_two_and_a_half_times_the_face_centred_on_it():
    """As docs/faces.md says: 2.5 times the face box's longer side, around its centre, in the photo's pixels."""
    photo = _photo(800, 600)
    box = (300.0, 200.0, 380.0, 300.0)  # 80 x 100: the longer side is 100
    region = cut_region(photo, box, [(320, 240), (360, 240)])
    assert REGION_SCALE == 2.5 and (region.width, region.height) == (250, 250)
    assert region.box == (85.0, 75.0, 165.0, 175.0)  # the box, centred in the region, unscaled
    assert region.landmarks == ((105.0, 115.0), (145.0, 115.0))
    pixels = np.asarray(region.pixels(), np.int16)
    original = np.asarray(photo.crop((215, 125, 465, 375)), np.int16)
    assert np.abs(pixels - original).mean() < 2.0  # the stored JPEG is the photo's pixels, nearly exactly


def test_a_large_face_is_scaled_down_to_the_embedders_largest_input_and_an_edge_face_is_clipped():
    photo = _photo(2000, 1500)
    region = cut_region(photo, (900.0, 600.0, 1348.0, 1048.0))  # 448 pixels: scaled by a half
    assert max(region.box[2] - region.box[0], region.box[3] - region.box[1]) == pytest.approx(FACE_MAX_PX, abs=0.6)
    assert region.width == region.height == 560
    edge = cut_region(photo, (0.0, 10.0, 100.0, 110.0))
    assert (edge.width, edge.height) == (175, 185)  # what the photo has of the square, no padding invented
    assert edge.box == (0.0, 10.0, 100.0, 110.0)


def test_a_region_must_hold_together():
    good = face_region(1)
    assert Image.open(io.BytesIO(good.image)).format == "JPEG"
    bad = [
        (FaceRegion(b"not an image", 96, 96, good.box), "does not decode"),
        (FaceRegion(good.image, 95, 96, good.box), "it says 95x96"),
        (FaceRegion(good.image[: len(good.image) // 2], 96, 96, good.box), "does not decode"),
        (FaceRegion(good.image, 96, 96, (200.0, 200.0, 300.0, 300.0)), "outside"),
        (FaceRegion(good.image, 96, 96, (50.0, 50.0, 40.0, 60.0)), "right > left"),
        (FaceRegion(good.image, 96, 96, good.box, ((float("nan"), 1.0),)), "finite"),
        (FaceRegion(_gif(), 96, 96, good.box), "a JPEG or a PNG"),
    ]
    for region, message in bad:
        with pytest.raises(InvalidFace, match=message):
            check_region(region)


def _gif() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (96, 96)).save(out, format="GIF")
    return out.getvalue()


# --- bad input --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("userid, message", [
    ("", "empty"),
    (" ann", "whitespace"),
    ("ann\u00a0", "whitespace"),
    ("a\nb", "control character"),
    ("a\x00b", "control character"),
    ("a\u2028b", "line separator"),
    ("x" * 129, "129 characters"),
    ("unknown", "matches nobody"),
    ("Unknown", "matches nobody"),
    (42, "text"),
    (None, "text"),
])
def test_a_bad_userid_is_refused_with_what_is_wrong(gallery, userid, message):
    with pytest.raises(InvalidUserId, match=message) as raised:
        gallery.register(userid, faces_of("x", 0, 1), EMBEDDER_A)
    assert raised.value.status == 400 and isinstance(raised.value, ServeError)
    assert gallery.userids() == []


def test_the_longest_userid_and_any_visible_text_are_taken():
    assert check_userid("x" * 128) == "x" * 128
    assert check_userid("Anne-Marie O'Neil (garden) #2 ☂") == "Anne-Marie O'Neil (garden) #2 ☂"


def test_deleting_or_listing_an_unknown_person_is_a_404(gallery):
    with pytest.raises(UnknownUser, match="'nobody'") as raised:
        gallery.delete("nobody")
    assert raised.value.status == 404
    with pytest.raises(UnknownUser):
        gallery.faces("nobody")


@pytest.mark.parametrize("vector, error, message", [
    (np.ones(DIMENSION, np.float32), InvalidVector, "norm is 8"),
    (np.full(DIMENSION, np.nan, np.float32), InvalidVector, "NaN"),
    (np.ones(DIMENSION, np.int8), InvalidVector, "floats"),
    ([0.1] * DIMENSION, InvalidVector, "list"),
    (np.ones((2, DIMENSION), np.float32) / np.sqrt(DIMENSION), InvalidVector, "shape"),
    (np.ones(1, np.float32), InvalidVector, "2 to 4096"),
])
def test_a_bad_vector_is_refused_with_what_is_wrong(gallery, vector, error, message):
    with pytest.raises(error, match=message):
        gallery.register("ann", [NewFace(face_region(1), vector)], EMBEDDER_A)
    assert gallery.userids() == []


def test_a_vector_of_another_dimension_under_one_embedder_is_a_conflict(gallery):
    gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
    with pytest.raises(DimensionMismatch, match="64") as raised:
        gallery.register("bob", [NewFace(face_region(2), unit_vector(2, 128))], EMBEDDER_A)
    assert raised.value.status == 409
    with pytest.raises(DimensionMismatch):
        gallery.register("bob", [NewFace(face_region(2), unit_vector(2, 128)), *faces_of("bob", 0, 1)], EMBEDDER_B)
    with pytest.raises(DimensionMismatch):
        gallery.search(EMBEDDER_A, unit_vector(3, 128))
    assert gallery.userids() == ["ann"] and gallery.embedders()[0].dimension == DIMENSION
    gallery.register("bob", [NewFace(face_region(2), unit_vector(2, 128))], EMBEDDER_B)  # another model: its own


@pytest.mark.parametrize("embedder", ["", "abc", "g" * 64, None, EMBEDDER_A + "0"])
def test_an_embedder_is_named_by_its_sha256(gallery, embedder):
    with pytest.raises(InvalidEmbedderId, match="sha256"):
        gallery.register("ann", faces_of("ann", 0, 1), embedder)
    with pytest.raises(InvalidEmbedderId):
        gallery.search(embedder, unit_vector(1))


def test_an_upper_case_sha256_is_the_same_embedder(gallery):
    gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A.upper())
    assert gallery.search(EMBEDDER_A, key_vector("ann", 0, 0))[0].userid == "ann"


def test_no_face_or_too_many_faces_are_refused_and_nothing_is_half_written(gallery):
    with pytest.raises(InvalidFace, match="at least one"):
        gallery.register("ann", [], EMBEDDER_A)
    with pytest.raises(InvalidFace, match="NewFace"):
        gallery.register("ann", [face_region(1)], EMBEDDER_A)
    gallery.register("ann", faces_of("ann", 0, FACES_PER_PERSON_MAX - 1), EMBEDDER_A)
    with pytest.raises(TooManyFaces, match="99 faces"):
        gallery.register("ann", faces_of("ann", 1, 2), EMBEDDER_A, replace=False)
    with pytest.raises(TooManyFaces):
        gallery.register("bob", faces_of("bob", 0, FACES_PER_PERSON_MAX + 1), EMBEDDER_A)
    assert len(gallery.faces("ann")) == FACES_PER_PERSON_MAX - 1 and gallery.userids() == ["ann"]
    # a bad face among good ones: the whole registration is refused
    with pytest.raises(InvalidFace):
        gallery.register("cy", [*faces_of("cy", 0, 2), NewFace(FaceRegion(b"x", 9, 9, (1, 1, 2, 2)),
                                                               unit_vector(1))], EMBEDDER_A)
    assert gallery.userids() == ["ann"]


# --- the file ---------------------------------------------------------------------------------------------------

def test_the_gallery_is_a_private_wal_file_with_the_gallery_s_header(tmp_path):
    path = tmp_path / "new" / "dir" / "faces.db"
    with Gallery(path) as gallery:
        gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
        assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
        assert Path(f"{path}-wal").stat().st_mode & 0o777 == 0o600
    connection = sqlite3.connect(path)
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert connection.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    connection.close()


def test_a_file_that_is_not_a_gallery_is_refused_and_left_untouched(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_bytes(b"my notes, not a database\n" * 200)
    other = tmp_path / "other.db"
    connection = sqlite3.connect(other)
    connection.execute("CREATE TABLE t (x)")
    connection.execute("INSERT INTO t VALUES (1)")
    connection.commit()
    connection.close()
    newer = tmp_path / "newer.db"
    Gallery(newer).close()
    connection = sqlite3.connect(newer)
    connection.execute("PRAGMA user_version = 2")
    connection.close()
    for path, message in ((text, "not an SQLite database"), (other, "application_id is 0x0"),
                          (newer, "schema 2, written by a newer")):
        before = path.read_bytes()
        with pytest.raises(ForeignDatabase, match=message) as raised:
            Gallery(path)
        assert raised.value.status == 500 and "left untouched" in str(raised.value)
        assert path.read_bytes() == before
    assert not Path(f"{other}-wal").exists()


def test_a_write_that_waits_too_long_for_another_process_is_busy(tmp_path):
    from app.faces import GalleryBusy
    path = tmp_path / "faces.db"
    Gallery(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Gallery(path, busy_timeout_s=0.05) as gallery:
            with pytest.raises(GalleryBusy) as raised:
                gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
            assert raised.value.status == 503 and raised.value.retry_after_s > 0
            assert gallery.userids() == []  # reads go on
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_the_default_place_is_the_xdg_data_directory(tmp_path):
    assert default_data_dir({"XDG_DATA_HOME": "/srv/data", "HOME": "/home/u"}) == Path("/srv/data/edgetpu-serve")
    assert default_data_dir({"XDG_DATA_HOME": "relative", "HOME": "/home/u"}) == \
        Path("/home/u/.local/share/edgetpu-serve")
    assert default_data_dir({"HOME": "/home/u"}) == Path("/home/u/.local/share/edgetpu-serve")
    assert default_gallery_path({"HOME": "/home/u"}) == Path("/home/u/.local/share/edgetpu-serve/faces.db")
    assert not default_gallery_path().is_relative_to(ROOT)


def test_every_gallery_error_is_a_serve_error_with_a_status():
    import app.faces.errors as errors
    classes = [value for value in vars(errors).values() if isinstance(value, type) and issubclass(value, Exception)]
    gallery = [cls for cls in classes if issubclass(cls, GalleryError)]
    assert len(gallery) >= 15 and all(issubclass(cls, ServeError) and 400 <= cls.status < 600 for cls in gallery)


def test_the_package_imports_no_web_framework():
    for module in sorted((ROOT / "app" / "faces").glob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        assert not imported & {"fastapi", "starlette", "httpx", "uvicorn", "pydantic"}, module
        assert not {name for name in imported if name == "app"} or all(
            node.module.startswith(("app.faces", "app.errors")) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app")), module


def test_a_gallery_where_none_can_be_made_is_a_gallery_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(GalleryError, match="cannot make the face gallery"):
        Gallery(blocker / "faces.db")
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(GalleryError):
        Gallery(tmp_path / "dir.db")


def test_a_delete_that_cannot_empty_the_wal_still_stands(tmp_path):
    """Another connection writing keeps the WAL: the deletion is committed and says it is not erased yet."""
    path = tmp_path / "faces.db"
    with Gallery(path, busy_timeout_s=0.05) as gallery:
        gallery.register("ann", faces_of("ann", 0, 1), EMBEDDER_A)
        gallery.register("bob", faces_of("bob", 0, 1), EMBEDDER_A)
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN")
        writer.execute("SELECT count(*) FROM person").fetchone()  # a reader's snapshot, with ann
        deletion = gallery.delete("ann")
        assert (deletion.faces, deletion.erased) == (1, False)
        writer.execute("COMMIT")
        writer.close()
        assert gallery.userids() == ["bob"] and gallery.erase_freed() is True
