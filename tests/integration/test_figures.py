"""Figures kept: a page's pictures cropped from its image, stored beside the transcript, referenced from the markdown
and the JSON, and served under the tenant's access rules. Through the real handlers, moto, PostgreSQL and the fake
provider."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest
from pagescribe.runtime import shutdown_runtime
from pagescribe.settings import get_settings
from PIL import Image

from tests.fakes.chat_server import FakeChatServer, Ok
from tests.integration.test_api import API_KEY, call
from tests.support.pipeline import Pipeline

pytestmark = pytest.mark.integration

ANSWER = "Some text above.\n\n[Figure: a grey square]\n\nFigure 1: The sample picture.\n\nSome text below."


def test_a_pages_picture_is_kept_beside_the_transcript_and_both_transcripts_point_at_it(
    pipeline: Pipeline, fake_provider: FakeChatServer, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given pdfTeX's sample page with one picture, answered by a model that describes the figure and its caption
    monkeypatch.setenv("API_KEY", API_KEY)
    shutdown_runtime()
    get_settings.cache_clear()
    fake_provider.set_default(Ok(text=ANSWER))
    # When it is transcribed
    [document] = pipeline.upload("uploads/image.pdf", corpus / "pdflatex-image.pdf")["documents"]
    pipeline.run_until_idle()
    document_id = document["document_id"]
    # Then its crop is stored beside the transcript, a PNG of the picture's shape (300 x 200 pt)
    key = f"transcripts/{document_id}/figures/p0001-1.png"
    stored = pipeline.s3.get_object(Bucket=pipeline.bucket, Key=key)["Body"].read()
    with Image.open(io.BytesIO(stored)) as crop:
        assert crop.format == "PNG" and abs(crop.width / crop.height - 1.5) < 0.02
    # And the markdown shows it in place of the model's description, captioned, linked beside the transcript
    markdown, transcript = pipeline.transcript(document_id)
    assert f"![Figure 1: The sample picture.]({document_id}/figures/p0001-1.png)" in markdown
    assert "[Figure: a grey square]" not in markdown and "Some text below." in markdown
    # And the JSON names its key, its box, the figure block it stands for and that block's caption
    [figure] = transcript["pages"][0]["figures"]
    blocks = {block["id"]: block["type"] for block in transcript["pages"][0]["blocks"]}
    assert figure["key"] == key and blocks[figure["block"]] == "figure" and blocks[figure["caption"]] == "caption"
    assert figure["bbox"]["points"] == pytest.approx([147.64, 229.31, 447.64, 429.31], abs=1.0)
    # And the API gives the tenant a short-lived link to it, and another tenant's key nothing
    code, figures = call("GET", f"/documents/{document_id}/pages/1/figures")
    assert code == 200 and len(figures["figures"]) == 1
    assert httpx.get(figures["figures"][0]["url"]).content == stored
    assert call("GET", f"/documents/{document_id}/pages/9/figures")[0] == 404
