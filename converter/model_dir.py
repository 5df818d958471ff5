"""Writing model directories whole and atomically: app/model_dir/writing.py, which the service uploads through
too; the converter's callers import it from here."""

from app.model_dir.writing import add_files, file_entry, update_manifest, write_model_dir

__all__ = ["add_files", "file_entry", "update_manifest", "write_model_dir"]
