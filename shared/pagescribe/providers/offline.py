"""The offline provider: OCR on the CPU with RapidOCR and onnxruntime, with no network and no API key.

RapidOCR (the ``offline`` extra) ships its ONNX models inside its wheel. The engine is pointed at those
files by path, so it never reaches its download code: nothing is fetched at run time, and a rapidocr
release that does not ship them is refused when the provider is constructed.

Each page is decoded, recognised and laid out in a worker thread, so the event loop stays free. A
RapidOCR engine keeps per-call state and is not documented as thread-safe, so no engine is ever used by
two threads at once: each of the ``max_workers`` threads takes an idle engine or builds one, lazily, on
its first page, and the engines are reused for every later page.

The prompt, model and output-token limit of a request are ignored: OCR takes none of them. The detected
boxes are laid out by :mod:`pagescribe.layout`. A page whose lines run up or down, or that reads with a low
confidence, is read again turned (a scan the renderer's orientation detection left as it was), and the better
reading kept.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import io
import logging
import os
import queue
import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata, resources
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from pagescribe.figures import find_figures
from pagescribe.layout import boxes_to_text
from pagescribe.layout.boxes import Figure, TextBox, mean_confidence
from pagescribe.layout.markdown import PageNumbers
from pagescribe.providers.base import ProviderError, Transcription, TranscriptionRequest
from pagescribe.settings import OCR_LANGUAGES, ConfigurationError

if TYPE_CHECKING:
    from rapidocr import RapidOCR

logger = logging.getLogger(__name__)

# A page the renderer's orientation detection left turned is read upright all the same. Sideways text shows in the
# engine's boxes: a line running up or down is a tall box, where upright lines are wide ones (on born-digital pages
# turned by 90 degrees, 96-100 % of the boxes of three characters or more were tall, upright none). Such a page is
# read turned a quarter each way; the engine reads the right way at a mean confidence of 0.95-0.99 and the wrong
# way (upside down) at 0.59-0.87. Upside-down text reads at 0.59-0.87 (a table of figures and a table of contents
# at 0.81), the same pages upright at 0.98-0.99 (the 43 born-digital pages of bench.ocr: 0.979 and up): a page read
# below UPSIDE_DOWN_BELOW is read again turned by 180 degrees, and that reading kept when UPSIDE_DOWN_GAIN more
# confident.
SIDEWAYS_CHARACTERS = 3
SIDEWAYS_ASPECT = 1.5
SIDEWAYS_SHARE = 0.5
UPSIDE_DOWN_BELOW = 0.9
UPSIDE_DOWN_GAIN = 0.15
# Small type is read again larger. The detection model finds lines of a page rendered at the default 1568 pixels
# whose boxes are 20 pixels tall and more (10-point type and up) and misses a third of the lines, mostly lone digits,
# of a statistical table set in 6-point type (boxes of 13-14 pixels): the NICS table read 76 % of its words, 95 % at
# one and a half times the size. A page whose median box is under SMALL_TEXT_PIXELS tall is read again enlarged to
# bring it to TEXT_PIXELS, at most MAX_ENLARGEMENT times, and that reading kept: only such pages pay for it.
SMALL_TEXT_PIXELS = 17
TEXT_PIXELS = 24
MAX_ENLARGEMENT = 2.0
# The detection model's candidate boxes are capped at max_candidates, taken in the order OpenCV finds their contours,
# from the bottom of the page up: RapidOCR's default (1000) silently dropped the top third of a dense table page.
DETECTION_CANDIDATES = 10_000
_DETECTION_MODEL = "PP-OCRv6_det_small.onnx"  # in the rapidocr wheel (3.10.0 ships it), its default
READ_MAX_LONG_EDGE = 1024  # a second read's image, at most this long: grounding needs the words, not every serif
_MISSING_EXTRA = "the offline provider needs the 'offline' extra: pip install 'pagescribe[offline]'"


class RapidOcrProvider:
    """Transcribes page images with RapidOCR on the CPU, at most ``max_workers`` pages at a time.

    Each worker thread has its own engine (its own models in memory) and divides the CPU cores with the
    others. A page whose time runs out cannot be stopped: its thread finishes it in the background,
    and later pages wait for a free worker within their own time.
    """

    def __init__(
        self, *, language: str, page_numbers: PageNumbers, orient: bool, max_workers: int = 1, threads: int = 0
    ) -> None:
        """``threads``: each engine's compute threads (OCR_THREADS); 0, the cores divided among the workers."""
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, not {max_workers}")
        if threads < 0:
            raise ValueError(f"threads must be 0 (the cores) or more, not {threads}")
        self._engine_class = _import_rapidocr()
        self._model = f"rapidocr-{metadata.version('rapidocr')}"
        threads = threads or max(1, (os.cpu_count() or 1) // max_workers)
        self._engine_params = _engine_params(language, threads=threads)
        self._max_workers = max_workers
        self._page_numbers: PageNumbers = page_numbers
        self._orient = orient  # read a page again turned when it reads sideways or unsure (DETECT_ORIENTATION)
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pagescribe-ocr")
        self._idle: queue.SimpleQueue[RapidOCR] = queue.SimpleQueue()
        self._loads_lock = threading.Lock()
        self._engine_loads = 0

    def __repr__(self) -> str:
        return f"RapidOcrProvider(max_workers={self._max_workers})"

    @property
    def name(self) -> str:
        return "offline:rapidocr"

    def answering_model(self, requested: str) -> str:
        return self._model  # the engine reads every page, whichever model the document names

    def serving(self, model: str) -> str:
        return self.name

    @property
    def engine_loads(self) -> int:
        """How many OCR engines this provider has built: at most one per worker thread."""
        return self._engine_loads

    async def transcribe(self, request: TranscriptionRequest, *, call_seconds: float) -> Transcription:
        """Transcribe one page; return or raise :class:`ProviderError` within ``call_seconds``."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(call_seconds):
                boxes, rotation, figures = await loop.run_in_executor(
                    self._executor, self._recognise, request.image.data
                )
        except TimeoutError:
            raise ProviderError(
                f"offline OCR did not finish within the call's {call_seconds:g} s", retryable=True
            ) from None
        return Transcription(
            text=boxes_to_text(boxes, page_numbers=self._page_numbers, figures=figures),
            finish_reason="stop",
            model=self._model,
            prompt_tokens=None,
            completion_tokens=None,
            cost=0.0,
            request_id=None,
            latency_seconds=loop.time() - started,
            confidence=mean_confidence(boxes),
            rotation=rotation,
            lines=tuple(boxes) if not rotation else (),  # in pixels of the image sent, unless the engine turned it
        )

    async def aclose(self) -> None:
        """Stop the workers, waiting for a page still being recognised, and free the engines."""
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        self._idle = queue.SimpleQueue()

    def _recognise(self, data: bytes) -> tuple[list[TextBox], int, list[Figure]]:
        """Runs in a worker thread: decode, OCR with an engine no other thread is using, the degrees clockwise the
        image was turned to read it (:func:`_sideways`, :data:`UPSIDE_DOWN_BELOW`), and the figures of the image
        so turned (:func:`pagescribe.figures.find_figures`)."""
        try:
            with Image.open(io.BytesIO(data)) as encoded:
                image = encoded.convert("RGB")
        except (OSError, Image.DecompressionBombError) as exc:
            raise ProviderError(f"cannot decode the page image: {exc}", retryable=False) from exc
        try:
            engine = self._idle.get_nowait()
        except queue.Empty:
            engine = self._build_engine()
        try:
            if self._orient:
                boxes, rotation = _read_upright(engine, image)
            else:
                boxes, rotation = _enlarged(engine, image, _text_boxes(engine(image))), 0
        except Exception as exc:
            raise ProviderError(f"offline OCR failed: {type(exc).__name__}: {exc}", retryable=False) from exc
        finally:
            self._idle.put(engine)
        return boxes, rotation, find_figures(image.rotate(-rotation, expand=True) if rotation else image, boxes)

    def _build_engine(self) -> RapidOCR:
        try:
            engine = self._engine_class(params=self._engine_params)
        except Exception as exc:
            raise ProviderError(
                f"cannot start the offline OCR engine: {type(exc).__name__}: {exc}", retryable=False
            ) from exc
        with self._loads_lock:
            self._engine_loads += 1
            loads = self._engine_loads
        logger.info("built offline OCR engine %d (%s)", loads, self._model)
        return engine


def _read_upright(engine: RapidOCR, image: Image.Image) -> tuple[list[TextBox], int]:
    """The image's text boxes read upright, and the degrees clockwise it was turned for that.

    A page whose lines run up or down (:func:`_sideways`) is read again turned a quarter each way, and the more
    confident reading kept. A page read with a mean confidence below UPSIDE_DOWN_BELOW is read again turned by 180
    degrees, and that reading kept when UPSIDE_DOWN_GAIN more confident. The way up is found at the size sent; only
    the page so turned is read again enlarged where its type is small (:func:`_enlarged`), once.
    """
    boxes = _text_boxes(engine(image))
    angle = 0
    if _sideways(boxes):
        turned = [(_text_boxes(engine(image.rotate(-quarter, expand=True))), quarter) for quarter in (90, 270)]
        best, quarter = max(turned, key=lambda reading: mean_confidence(reading[0]) or 0.0)
        if not _sideways(best):
            boxes, angle = best, quarter
    elif (confidence := mean_confidence(boxes)) is not None and confidence < UPSIDE_DOWN_BELOW:
        flipped = _text_boxes(engine(image.rotate(180)))
        if (mean_confidence(flipped) or 0.0) >= confidence + UPSIDE_DOWN_GAIN:
            boxes, angle = flipped, 180
    return _enlarged(engine, image.rotate(-angle, expand=True) if angle else image, boxes), angle


def _enlarged(engine: RapidOCR, image: Image.Image, boxes: list[TextBox]) -> list[TextBox]:
    """The image's boxes as read (``boxes``), or where its type is small (its median box under SMALL_TEXT_PIXELS
    tall) the image read again enlarged towards TEXT_PIXELS, at most MAX_ENLARGEMENT times, in its own pixels."""
    heights = [box.bottom - box.top for box in boxes]
    if not heights or (median := statistics.median(heights)) >= SMALL_TEXT_PIXELS:
        return boxes
    factor = min(MAX_ENLARGEMENT, TEXT_PIXELS / median)
    enlarged = image.resize((round(image.width * factor), round(image.height * factor)), Image.Resampling.LANCZOS)
    return [_scaled(box, 1 / factor) for box in _text_boxes(engine(enlarged))]


def _sideways(boxes: list[TextBox]) -> bool:
    """The page's lines run up or down: of its boxes of SIDEWAYS_CHARACTERS characters or more, at least two and
    SIDEWAYS_SHARE of them are more than SIDEWAYS_ASPECT times as tall as they are wide."""
    lines = [box for box in boxes if len(box.text) >= SIDEWAYS_CHARACTERS and box.right is not None]
    tall = sum(
        box.bottom - box.top > SIDEWAYS_ASPECT * (box.right - box.left) for box in lines if box.right is not None
    )
    return tall >= 2 and tall >= SIDEWAYS_SHARE * len(lines)


def _import_rapidocr() -> type[RapidOCR]:
    try:
        importlib.import_module("onnxruntime")  # rapidocr imports it only when it loads the first model
        from rapidocr import RapidOCR
    except ImportError as exc:
        raise ConfigurationError(_MISSING_EXTRA) from exc
    return RapidOCR


def _bundled_models(language: str) -> dict[str, Path]:
    """The detection model and ``language``'s recognition model inside the installed rapidocr package, by RapidOCR
    config section."""
    if language not in OCR_LANGUAGES:
        raise ConfigurationError(
            f"no recognition model for language {language!r} ships in the rapidocr wheel (pagescribe never downloads "
            f"models); the languages that ship: {', '.join(sorted(OCR_LANGUAGES))}"
        )
    directory = Path(str(resources.files("rapidocr").joinpath("models")))
    files = {"Det": _DETECTION_MODEL, "Rec": OCR_LANGUAGES[language]}
    paths = {stage: directory / name for stage, name in files.items()}
    missing = sorted(name for name, path in zip(files.values(), paths.values(), strict=True) if not path.is_file())
    if missing:
        raise ConfigurationError(
            f"rapidocr {metadata.version('rapidocr')} does not ship {', '.join(missing)} in {directory}, and "
            "pagescribe never downloads models: install the 'offline' extra, pip install 'pagescribe[offline]'"
        )
    return paths


def _engine_params(language: str, *, threads: int, arena: bool = True) -> dict[str, object]:
    return {
        "Global.use_cls": False,  # pages are upright; the text-direction classifier only costs time
        "Global.log_level": "error",  # RapidOCR's own logger; it warns on every blank page
        "Det.max_candidates": DETECTION_CANDIDATES,
        "EngineConfig.onnxruntime.enable_cpu_mem_arena": arena,
        "EngineConfig.onnxruntime.intra_op_num_threads": threads,
        **{f"{stage}.model_path": str(path) for stage, path in _bundled_models(language).items()},
    }


def read_lines(data: bytes, language: str, *, max_long_edge: int = READ_MAX_LONG_EDGE) -> list[TextBox]:
    """The lines of an encoded image as the engine reads it, as it stands (no turning: the second read of a page image
    that the renderer already set upright), with one engine per process, built on the first image, on one thread
    (a render process beside the function's own work) and without onnxruntime's memory arena (it reserves address
    space that the process's limit counts). The image is read at most ``max_long_edge`` pixels long (about half the
    memory and time of a full page render; enough to ground to), its boxes given in the pixels of the image as sent."""
    with Image.open(io.BytesIO(data)) as encoded:
        image = encoded.convert("RGB")
    scale = min(1.0, max_long_edge / max(image.size))
    if scale < 1.0:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    return [_scaled(box, 1 / scale) for box in _text_boxes(_reader(language)(image))]


def _scaled(box: TextBox, factor: float) -> TextBox:
    if factor == 1.0:
        return box
    right = box.right * factor if box.right is not None else None
    return TextBox(box.text, box.left * factor, box.top * factor, box.bottom * factor, box.score, right)


@functools.cache
def _reader(language: str) -> RapidOCR:
    # one line recognised at a time: the recognition model's attention grows with the square of a batch's widest
    # line, and a batch of six wide lines took more than 1.5 GB
    return _import_rapidocr()(params={**_engine_params(language, threads=1, arena=False), "Rec.rec_batch_num": 1})


def _text_boxes(result: object) -> list[TextBox]:
    """The recognised lines of a RapidOCR result; none when nothing was detected or recognised."""
    from rapidocr.utils.output import RapidOCROutput

    if not isinstance(result, RapidOCROutput) or result.boxes is None or result.txts is None:
        return []
    scores = result.scores if result.scores is not None else (1.0,) * len(result.txts)
    boxes: list[TextBox] = []
    for points, text, score in zip(result.boxes, result.txts, scores, strict=True):
        if text.strip():
            xs, ys = points[:, 0], points[:, 1]
            boxes.append(
                TextBox(text.strip(), float(xs.min()), float(ys.min()), float(ys.max()), float(score), float(xs.max()))
            )
    return boxes
