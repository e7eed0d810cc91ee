"""The review page (GET /review), used as a person uses it: sign in with a key, drop a file, follow its pages, open it,
move between flagged pages with the keyboard, re-run a page, correct one, download the transcript; and a hostile
transcript that stays text."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.pages import render_page
from pagescribe.sources.textlayer import extract_text_layer, read_text_layer
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.remote.webelement import WebElement

from tests.browser.conftest import API_KEY, MODEL, OTHER_MODEL, Page, Stack
from tests.fakes.chat_server import Ok
from tests.support.answers import captured

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("review-page")]  # one stack, on one worker

FINISHED = {"COMPLETED", "PARTIAL", "FAILED"}
HOSTILE = (
    "# Invoice\n\n"
    "<script>window.pwned = 'script'; document.title = 'pwned';</script>\n\n"
    "<img src=x onerror=\"window.pwned = 'onerror'; document.title = 'pwned';\">\n\n"
    '<a href="javascript:window.pwned=1">a link</a> and **Total: 42 EUR**\n'
)

# A transcript that names the page's own elements, links out, loads remote and inline images, and opens a dialog and
# a popover over the page (a forged "sign in again"): what a hostile document can make a model write
CLOBBERING = (
    "# Statement\n\n"
    "Pay to IBAN DE00 1111 2222 3333 4444 00\n\n"
    '<div id="editor-text">IBAN DE99 ATTACKER</div>\n\n'
    '<p id="raw" name="rendered">the raw view, blanked</p>\n\n'
    "[pay here](https://evil.example/phish) ![logo](https://evil.example/logo.png) "
    "![pixel](data:image/png;base64,iVBORw0KGgo=)\n\n"
    "<dialog open>Your session expired: sign in at evil.example</dialog>\n\n"
    '<div popover="manual">a popover</div>\n'
)
REVIEWED = "Pay to IBAN DE00 1111 2222 3333 4444 00, checked against the page."

CORRECTED = "Page two, as a reviewer reads it."
INVENTED = "The committee approved an additional budget of forty million dollars for the new facility."
# Where the image is drawn in its element (object-fit: contain centres it), and each box over it, in the viewport
GEOMETRY = """
const img = document.getElementById('page-img');
const r = img.getBoundingClientRect();
const fit = Math.min(r.width / img.naturalWidth, r.height / img.naturalHeight);
const [width, height] = [img.naturalWidth * fit, img.naturalHeight * fit];
const image = {left: r.left + (r.width - width) / 2, top: r.top + (r.height - height) / 2, width, height};
const boxes = [...document.querySelectorAll('#page-boxes .box')].map((box) => {
  const b = box.getBoundingClientRect();
  return {id: box.dataset.blockId || null, missed: box.classList.contains('missed'), title: box.title,
          left: b.left, top: b.top, width: b.width, height: b.height};
});
return {image, boxes};
"""


def press(page: Page, key: str) -> None:
    """A key pressed with the focus on the page itself, not in a field."""
    page.script("document.activeElement && document.activeElement.blur()")
    ActionChains(page.driver).send_keys(key).perform()


def point_at(page: Page, target: WebElement) -> None:
    """The mouse moved over an element, brought into view first."""
    page.script("arguments[0].scrollIntoView({block: 'center'})", target)
    ActionChains(page.driver).move_to_element(target).perform()


def linked(target: WebElement) -> bool:
    return "linked" in (target.get_attribute("class") or "").split()


def boxes_shown(page: Page, number: int) -> bool:
    """Page ``number`` is shown, its image loaded and the boxes over it placed."""
    return page.shown_page() == number and bool(page.find("#page-boxes").is_displayed())


def within(box: dict[str, float], image: dict[str, float], slack: float = 1.0) -> bool:
    """A box (its viewport rectangle) lies on the image as it is displayed."""
    return (
        image["left"] - slack <= box["left"]
        and box["left"] + box["width"] <= image["left"] + image["width"] + slack
        and image["top"] - slack <= box["top"]
        and box["top"] + box["height"] <= image["top"] + image["height"] + slack
    )


def test_a_dropped_pdf_is_followed_listed_opened_and_its_flagged_page_re_run_and_corrected(
    page: Page, stack: Stack, corpus: Path
) -> None:
    # The whole scenario, in one flow.
    # Given a 4-page PDF whose page 2 the stack's model refuses (a captured real refusal: a hard flag, and no
    # escalation model, so the page fails), which another model transcribes; the other pages are answered faithfully
    source = corpus / "pdflatex-4-pages.pdf"
    images = {n: render_page(source, DocumentKind.PDF, n).data for n in range(1, 5)}
    for number, image in images.items():
        answer = captured("refusal")[0] if number == 2 else extract_text_layer(source, number)
        stack.answers.set(image, MODEL, Ok(text=answer))
    stack.answers.set(images[2], OTHER_MODEL, Ok(text=extract_text_layer(source, 2)))

    # When a person signs in with the key and drops the file
    page.sign_in(stack.api)
    row = page.drop(source)

    # Then its pages are followed live until it finishes: three done, one failed, one flagged
    assert page.finished(row) == "PARTIAL"
    assert (row.get_attribute("data-done"), row.get_attribute("data-failed")) == ("3", "1")
    assert row.get_attribute("data-flagged") == "1"
    assert "3 of 4 pages done · 1 failed (p. 2) · 1 flagged (p. 2)" in row.text
    document_id = str(row.get_attribute("data-document-id"))

    # And the documents list shows it, newest first, with its status, pages, flags and cost
    listed = f'#documents tr[data-document-id="{document_id}"]'
    page.until(lambda d: page.all(listed), "the document is listed")
    assert page.all("#documents tbody tr")[0].get_attribute("data-document-id") == document_id
    cells = [cell.text for cell in page.find(listed).find_elements("css selector", "td")]
    assert cells[:4] == ["pdflatex-4-pages.pdf", "PARTIAL", "3/4 (1 failed)", "1"]
    assert cells[4].startswith("$")

    # When it is opened from the list
    page.open_first_page(page.find(f"{listed} a"))
    assert "pdflatex-4-pages.pdf" in page.find("#doc-title").text
    assert "j" in page.find(".keys").text and "k" in page.find(".keys").text

    # And the reviewer presses j (next flagged page)
    press(page, "j")

    # Then page 2 is shown with its image beside its text, its flag and the value measured highlighted, and why
    page.until(lambda d: page.shown_page() == 2, "j moves to the flagged page 2")
    flags = {flag.get_attribute("data-flag"): flag for flag in page.all("#page-flags li")}
    assert "refusal" in flags, flags.keys()
    flag = flags["refusal"]
    assert float(flag.find_element("css selector", "mark").text) > 0.5
    assert "threshold 0.5" in flag.text
    assert "refusal" in page.find("#page-error").text
    page.until(
        lambda d: page.script("const i = document.getElementById('page-img'); return i.complete && i.naturalWidth")
    )
    assert page.find("#page-strip button[aria-current]").text == "2"
    if os.environ.get("REVIEW_SCREENSHOT"):  # docs/review.png: REVIEW_SCREENSHOT=docs/review.png pytest tests/browser
        page.driver.save_screenshot(os.environ["REVIEW_SCREENSHOT"])

    # When page 2 is re-run on the other model
    page.find("#rerun-model").send_keys(OTHER_MODEL)
    page.find("#rerun").click()

    # Then the page follows the document until it is finished again, and page 2 is done, unflagged, on that model
    page.until(lambda d: "re-run on" in page.find("#notice").text or "refused" in page.find("#notice").text, "answered")
    assert page.find("#notice").text == f"Page 2 re-run on {OTHER_MODEL}: COMPLETED."
    assert page.find("#doc-status").get_attribute("data-status") == "COMPLETED"
    assert page.shown_page() == 2 and page.all("#page-flags li") == []
    assert OTHER_MODEL in page.find("#page-facts").text
    assert extract_text_layer(source, 2).split()[0] in page.find("#rendered").text

    # When the reviewer corrects page 2 (e), saves the correction and downloads the markdown
    press(page, "e")
    page.until(lambda d: page.find("#editor-text").is_displayed(), "the editor opens")
    page.find("#editor-text").clear()
    page.find("#editor-text").send_keys(CORRECTED)
    page.find("#save").click()
    page.until(lambda d: "saved" in page.find("#notice").text, "the save is answered")
    assert page.find("#notice").text == "Correction of page 2 saved (revision 1)."
    page.find("#download-md").click()
    downloaded = page.downloads / "pdflatex-4-pages.md"
    page.until(lambda d: downloaded.is_file() and CORRECTED in downloaded.read_text(), "the .md arrives")

    # Then the downloaded markdown holds the correction in page 2's place, marked as one, and the other pages as read
    markdown = downloaded.read_text()
    second = markdown.split("<!-- page 2 of 4")[1].split("<!-- page 3 of 4")[0]
    assert "corrected (revision 1" in second and CORRECTED in second
    assert extract_text_layer(source, 3).split()[0] in markdown.split("<!-- page 3 of 4")[1]
    # And nothing the page did on the way needed what its Content-Security-Policy refuses
    assert page.policy_violations() == []


def test_a_grounded_page_shows_its_blocks_boxes_linked_to_its_text_and_what_is_invented_or_missed(
    page: Page, stack: Stack, corpus: Path, tmp_path: Path
) -> None:
    # Given a born-digital 4-page PDF (a copy with bytes of its own, so that no other test's transcript of the file is
    # reused) whose pages the model answers with their own text: page 2 with an invented sentence added as a
    # paragraph of its own, page 3 as three paragraphs with the middle one left out
    original = corpus / "pdflatex-4-pages.pdf"
    source = tmp_path / "grounded.pdf"
    source.write_bytes(original.read_bytes() + b"\n% a copy of its own\n")
    answers = {n: read_text_layer(original, n).laid_out for n in range(1, 5)}
    body, number = answers[2].rsplit("\n\n", 1)
    answers[2] = f"{body}\n\n{INVENTED}\n\n{number}"
    body, number = answers[3].rsplit("\n\n", 1)
    lines = body.split("\n")
    third = len(lines) // 3
    answers[3] = "\n\n".join(["\n".join(lines[:third]), "\n".join(lines[2 * third :]), number])
    for n, answer in answers.items():
        stack.answers.set(render_page(original, DocumentKind.PDF, n).data, MODEL, Ok(text=answer))

    # When it is dropped, transcribed (the grounding checks flag nothing here, their thresholds at 1, but every
    # page is grounded all the same) and opened
    page.sign_in(stack.api)
    row = page.drop(source)
    assert page.finished(row) == "COMPLETED"
    document_id = str(row.get_attribute("data-document-id"))
    transcript = httpx.get(
        f"{stack.api}/documents/{document_id}/transcript?format=json", headers={"x-api-key": API_KEY}
    ).json()
    row.find_element("css selector", "a").click()
    page.until(lambda d: boxes_shown(page, 1), "page 1 is shown with its boxes")

    # Then page 1's image carries one box per block that has one, each where its block's pixels put it on the image
    # as it is displayed
    first = transcript["pages"][0]
    size = first["grounding"]["image"]
    assert first["grounding"]["source"] == "text_layer"
    placed = {b["id"]: b["bbox"]["pixels"] for b in first["blocks"] if b["bbox"]}
    drawn = page.script(GEOMETRY)
    image = drawn["image"]
    assert placed and sorted(box["id"] for box in drawn["boxes"]) == sorted(placed)
    for box in drawn["boxes"]:
        assert within(box, image), (box, image)
        x0, y0, x1, _ = placed[box["id"]]
        assert box["left"] == pytest.approx(image["left"] + x0 * image["width"] / size["width"], abs=1.5), box
        assert box["top"] == pytest.approx(image["top"] + y0 * image["height"] / size["height"], abs=1.5), box
        assert box["width"] == pytest.approx((x1 - x0) * image["width"] / size["width"], abs=1.5), box
    # And the text is drawn block by block, and a line under the image says how the page was grounded
    assert len(page.all("#rendered [data-block-id]")) == len(first["blocks"])
    assert page.find("#grounding-note").text.startswith("Grounded to the text layer: 100 % of the answer found")

    # When the reviewer points at the paragraph in the text
    paragraph = next(b["id"] for b in first["blocks"] if b["type"] == "paragraph" and b["bbox"])
    text_block = page.find(f'#rendered [data-block-id="{paragraph}"]')
    box = page.find(f'#page-boxes [data-block-id="{paragraph}"]')
    point_at(page, text_block)
    # Then its box is highlighted, and no longer once the pointer leaves
    page.until(lambda d: linked(box) and linked(text_block), "the block's box is highlighted")
    point_at(page, page.find("#page-title"))
    page.until(lambda d: not page.all(".linked"), "nothing is highlighted")
    # And pointing at the box highlights its block in the text
    point_at(page, box)
    page.until(lambda d: linked(text_block), "the box's block is highlighted")
    point_at(page, page.find("#page-title"))
    # And so does moving the keyboard's focus to the block
    page.script("arguments[0].focus()", text_block)
    page.until(lambda d: linked(box), "the focused block's box is highlighted")

    # When the reviewer moves to page 2 (n)
    press(page, "n")
    page.until(lambda d: boxes_shown(page, 2) and page.all("#rendered mark.unsupported"), "page 2 is shown")
    # Then the invented sentence is marked as not on the page, in its own block, and nothing else is
    marks = page.all("#rendered mark.unsupported")
    assert " ".join(mark.text for mark in marks) == INVENTED
    assert marks[0].get_attribute("title") == "not on the page"
    invented = next(b for b in transcript["pages"][1]["blocks"] if b["unsupported"])
    assert invented["text"] == INVENTED and invented["bbox"] is None
    assert page.script("return arguments[0].closest('[data-block-id]').dataset.blockId", marks[0]) == invented["id"]
    assert "unsupported" in page.find("#grounding-note").text

    # When the reviewer moves to page 3
    press(page, "n")
    page.until(lambda d: boxes_shown(page, 3) and page.all("#page-boxes .missed"), "page 3 is shown")
    # Then the page's text the answer left out is outlined on the image, each region with its text as its title
    missed = transcript["pages"][2]["grounding"]["missed"]
    drawn = page.script(GEOMETRY)
    outlined = [box for box in drawn["boxes"] if box["missed"]]
    assert missed and len(outlined) == len(missed)
    assert [box["title"] for box in outlined] == [f"missed: {region['text']}" for region in missed]
    assert all(within(box, drawn["image"]) and box["height"] > 0 for box in outlined), outlined
    assert "of the page's text missed" in page.find("#grounding-note").text

    # When the same page is shown at a phone's width
    page.viewport(390, 844)

    # Then its boxes are placed anew, over the smaller image, and nothing is wider than the screen
    def placed_anew(drawn: dict[str, Any]) -> bool:
        return drawn["image"]["width"] < 390 and all(within(box, drawn["image"]) for box in drawn["boxes"])

    page.until(lambda d: placed_anew(page.script(GEOMETRY)), "the boxes are over the narrower image")
    assert page.script("return document.documentElement.scrollWidth") <= 390
    # And nothing the page did needed what its Content-Security-Policy refuses
    assert page.policy_violations() == []


def test_a_correction_is_saved_and_is_in_the_downloaded_markdown(page: Page, stack: Stack, corpus: Path) -> None:
    # Given a transcribed one-page document, open on the review page
    page.sign_in(stack.api)
    row = page.drop(corpus / "minimal-document.pdf")
    assert page.finished(row) in FINISHED
    page.open_first_page(row.find_element("css selector", "a"))

    # When the reviewer presses e, writes the page's markdown anew and saves it
    press(page, "e")
    page.until(lambda d: page.find("#editor-text").is_displayed(), "the editor opens")
    page.find("#editor-text").clear()
    page.find("#editor-text").send_keys("# Corrected heading\n\nFixed by a reviewer.")
    page.find("#save").click()

    # Then the correction is saved and shown, and the page is marked corrected
    page.until(lambda d: "saved" in page.find("#notice").text, "the save is answered")
    assert page.find("#notice").text == "Correction of page 1 saved (revision 1)."
    assert page.find("#rendered h1").text == "Corrected heading"
    assert "corrected" in (page.find("#page-strip button[aria-current]").get_attribute("class") or "")

    # And the downloaded markdown holds it
    page.find("#download-md").click()
    downloaded = page.downloads / "minimal-document.md"
    page.until(lambda d: downloaded.is_file() and "Fixed by a reviewer." in downloaded.read_text(), "the .md arrives")


def test_a_pages_kept_figures_are_shown_under_its_text(page: Page, stack: Stack, corpus: Path) -> None:
    # Given pdfTeX's sample page with a picture, transcribed
    page.sign_in(stack.api)
    row = page.drop(corpus / "pdflatex-image.pdf")
    assert page.finished(row) in FINISHED
    # When it is opened on the review page
    page.open_first_page(row.find_element("css selector", "a"))
    # Then its kept figure is shown under the text, loaded from the API's short-lived link
    page.until(lambda d: page.find("#figures").is_displayed(), "the figures are shown")
    loaded = "return [...document.querySelectorAll('#figures img')].map((img) => img.complete && img.naturalWidth)"
    page.until(lambda d: page.script(loaded) not in ([], [0], [False]), "the figure loads")
    [width] = page.script(loaded)
    assert width > 100 and page.find("#figures img").get_attribute("alt") == "figure 1 of page 1"


def test_a_hostile_transcript_is_shown_as_inert_text(page: Page, stack: Stack, corpus: Path) -> None:
    # Given an image whose transcript carries a script, an image with an onerror handler and a javascript: link
    image = corpus / "smile.png"
    stack.answers.set(render_page(image, DocumentKind.PNG, 1).data, MODEL, Ok(text=HOSTILE))
    page.sign_in(stack.api)
    row = page.drop(image)
    assert page.finished(row) in FINISHED

    # When it is opened on the review page
    row.find_element("css selector", "a").click()
    page.until(lambda d: "Total: 42 EUR" in page.find("#rendered").text, "the transcript is rendered")

    # Then its markdown is rendered, and nothing of it ran or can run
    assert page.find("#rendered h1").text == "Invoice"
    assert page.script("return window.pwned") is None
    assert page.driver.title == "pagescribe review"
    assert page.script("return document.querySelectorAll('#rendered script, #rendered [onerror]').length") == 0
    assert page.script("return document.querySelectorAll('#rendered a').length") == 0
    assert "a link" in page.find("#rendered").text
    # And the raw view (r) shows the text as it is, tags and all, as text
    press(page, "r")
    page.until(lambda d: page.find("#raw").is_displayed(), "the raw view is shown")
    assert "<script>window.pwned = 'script';" in page.find("#raw").text
    assert page.script("return document.querySelectorAll('#raw *').length") == 0


def test_a_transcript_cannot_take_over_the_pages_elements_and_its_links_and_images_are_inert(
    page: Page, stack: Stack, corpus: Path
) -> None:
    # Given an image whose transcript names the page's editor and raw view, links out, embeds images, opens a dialog
    image = corpus / "smile.jpg"
    stack.answers.set(render_page(image, DocumentKind.JPEG, 1).data, MODEL, Ok(text=CLOBBERING))
    page.sign_in(stack.api)
    row = page.drop(image)
    assert page.finished(row) in FINISHED
    document_id = str(row.get_attribute("data-document-id"))

    # When it is opened on the review page
    row.find_element("css selector", "a").click()
    page.until(lambda d: "Pay to IBAN" in page.find("#rendered").text, "the transcript is rendered")

    # Then none of its elements carries an id or a name, no dialog or popover is there, no link or image is live
    live = "#rendered [id], #rendered [name], #rendered dialog, #rendered [popover], #rendered a, #rendered img"
    assert page.script(f"return document.querySelectorAll('{live}').length") == 0
    # And each link's and image's target is shown as text
    shown = page.find("#rendered").text
    assert "pay here <https://evil.example/phish>" in shown and "[image: logo] <https://evil.example/logo.png>" in shown
    assert "[image: pixel] <data:image/png;base64,iVBORw0KGgo=>" in shown

    # When the reviewer corrects the page in the editor and saves it
    press(page, "e")
    page.until(lambda d: page.find("#editor-text").is_displayed(), "the editor opens")
    page.find("#editor-text").clear()
    page.find("#editor-text").send_keys(REVIEWED)
    page.find("#save").click()
    page.until(lambda d: "saved" in page.find("#notice").text, "the save is answered")

    # Then what was saved is what the reviewer typed, not the transcript's planted text
    transcript = httpx.get(
        f"{stack.api}/documents/{document_id}/transcript", params={"format": "json"}, headers={"x-api-key": API_KEY}
    ).json()
    assert transcript["pages"][0]["text"] == REVIEWED
    # And the raw view shows the transcript as it is
    press(page, "r")
    page.until(lambda d: page.find("#raw").is_displayed(), "the raw view is shown")
    assert page.find("#raw").text == REVIEWED


def test_a_transcript_the_renderer_gives_up_on_is_shown_as_text(page: Page, stack: Stack, corpus: Path) -> None:
    # Given an image whose transcript is 2,000 nested quotes (marked's parser overflows its stack on it)
    image = corpus / "smile.tiff"
    stack.answers.set(render_page(image, DocumentKind.TIFF, 1).data, MODEL, Ok(text="> " * 2000 + "the quoted words"))
    page.sign_in(stack.api)
    row = page.drop(image)
    assert page.finished(row) in FINISHED

    # When it is opened on the review page
    row.find_element("css selector", "a").click()
    page.until(lambda d: page.all("#rendered .unrendered"), "the page is shown")

    # Then the text is shown as it is, saying the markdown could not be rendered
    assert page.find("#rendered .unrendered p").text.startswith("The markdown could not be rendered")
    assert page.find("#rendered .unrendered pre").text.endswith("the quoted words")


def test_the_page_fits_a_phone_and_puts_image_and_text_side_by_side_on_a_desktop(
    browser: Page, stack: Stack, corpus: Path
) -> None:
    # Given a transcribed document created over the API with the same key
    headers = {"x-api-key": API_KEY}
    created = httpx.post(
        f"{stack.api}/documents",
        json={"filename": "four pages.pdf", "content_type": "application/pdf"},
        headers=headers,
    ).json()
    put = httpx.put(
        created["upload_url"], content=(corpus / "pdflatex-4-pages.pdf").read_bytes(), headers=created["upload_headers"]
    )
    assert put.status_code == 200
    document = f"{stack.api}/review#doc/{created['document_id']}/1"

    # When it is opened at a desktop's width
    browser.viewport(1280, 900)
    browser.sign_in(stack.api)
    browser.driver.get(document)
    browser.until(lambda d: browser.all("#page-view[data-page]"), "the document is shown")
    # Then the page image and the markdown stand side by side
    image, text = (browser.find(css).rect for css in (".page-image", ".page-text"))
    assert image["x"] + image["width"] <= text["x"] and image["y"] == text["y"]

    # When the same views are shown at a phone's width (390 px)
    browser.viewport(390, 844)
    # Then nothing is wider than the screen, on the document and on the list, and the image is above the text
    assert browser.script("return document.documentElement.scrollWidth") <= 390
    image, text = (browser.find(css).rect for css in (".page-image", ".page-text"))
    assert image["y"] + image["height"] <= text["y"]
    browser.find(".back").click()
    browser.until(lambda d: browser.all(f'#documents tr[data-document-id="{created["document_id"]}"]'), "listed")
    assert browser.script("return document.documentElement.scrollWidth") <= 390


def test_a_wrong_key_is_refused_and_the_right_one_is_kept_for_the_tab_only(page: Page, stack: Stack) -> None:
    # When a wrong key is typed in
    page.driver.get(f"{stack.api}/review")
    page.script("sessionStorage.clear()")
    page.driver.get(f"{stack.api}/review")
    page.until(lambda d: page.find("#api-key").is_displayed(), "the key field is shown")
    page.find("#api-key").send_keys("not-the-key")
    page.find("#login-form button[type=submit]").click()
    # Then the page says so and stays on the key field, keeping nothing
    page.until(lambda d: page.find("#login-error").is_displayed(), "the refusal is shown")
    assert page.find("#login-error").text == "invalid API key"
    assert not page.find("#home").is_displayed() and page.script("return sessionStorage.length") == 0
    # When the right one is typed in, it is kept in the tab's sessionStorage, and nowhere that outlives the tab
    page.sign_in(stack.api)
    assert page.script("return sessionStorage.getItem('pagescribe.apiKey')") == API_KEY
    assert page.script("return localStorage.length") == 0 and page.script("return document.cookie") == ""
    # And "Forget key" forgets it
    page.find("#forget-key").click()
    page.until(lambda d: page.find("#api-key").is_displayed(), "the key field is shown again")
    assert page.script("return sessionStorage.length") == 0


def test_the_page_is_served_without_a_key_with_a_strict_policy_and_only_its_own_files(stack: Stack) -> None:
    # When the page and one of its files are fetched without a key
    html = httpx.get(f"{stack.api}/review")
    script = httpx.get(f"{stack.api}/review/purify.min.js")
    # Then both are served, with the policy that lets the page run only its own code and reach only the API and S3
    assert html.status_code == 200 and html.headers["content-type"] == "text/html; charset=utf-8"
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    policy = html.headers["content-security-policy"]
    assert policy.startswith(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' http://127.0.0.1:"
    )
    assert "base-uri 'none'; form-action 'none'; frame-ancestors 'none'" in policy
    assert (html.headers["x-content-type-options"], html.headers["referrer-policy"]) == ("nosniff", "no-referrer")
    # And a name off the allow-list, or a path out of the folder, is not found, and data still needs the key
    for path in ("/review/README.md", "/review/vendor%2Fpurify.min.js", "/review/..%2F..%2Fsettings.py", "/review/x/y"):
        assert httpx.get(f"{stack.api}{path}").status_code in (401, 404), path
    assert httpx.get(f"{stack.api}/documents").status_code == 401
