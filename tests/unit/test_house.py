"""One owner of the MLflow record (issue 40, item 2): every read and write of it, and every tag name, goes through the
tracking seam (infra/tracking.py). Checked on the source, as anyone can check it."""
import re

from infra.config import PROJECT_ROOT
from infra.tracking import Tag

CODE = [p for d in ("flows", "tasks", "infra") for p in (PROJECT_ROOT / d).rglob("*.py")
        if p != PROJECT_ROOT / "infra/tracking.py"]


def test_no_mlflow_client_outside_the_tracking_seam():
    for path in CODE:
        text = path.read_text()
        assert not re.search(r"\.client\.(search_|get_run|list_artifacts|download_artifacts|log_|set_tag|create_run)",
                             text), f"{path.relative_to(PROJECT_ROOT)} reads or writes MLflow past infra/tracking.py"
        assert "MlflowClient" not in text, path


def test_no_tag_name_outside_the_tracking_seam():
    names = {v for k, v in vars(Tag).items() if k.isupper()}
    assert len(names) >= 18
    for path in CODE:
        text = path.read_text()
        found = [n for n in names if f'"{n}"' in text or f"tags.`{n}`" in text or f"'{n}'" in text]
        assert not found, f"{path.relative_to(PROJECT_ROOT)} names {found}: use infra.tracking.Tag"
