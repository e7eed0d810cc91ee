import asyncio, sys
from bench.tiles import PAGES
from bench.forms import reading_truth, leaders_as_one
from bench.ocr import Reader, RENDER_OPTIONS
from pagescribe.sources.pages import render_page, render_band
from pagescribe.sources.documents import DocumentKind
from pagescribe.sources.textlayer import text_layer_words
from pagescribe.transcription.tileplan import plan_tiles, text_height, TileLimits
from pagescribe.transcription.stitching import stitch
from pagescribe.settings import Settings
from pagescribe_local.scoring import cer
page = PAGES[int(sys.argv[1])]
le = int(sys.argv[2])
opts = {**RENDER_OPTIONS, "max_long_edge": le}
with asyncio.Runner() as r:
    reader = Reader(r)
    whole = render_page(page.path, DocumentKind.PDF, page.page, **opts)
    a = reader.read(whole, "", 0)
    h = text_height(text_layer_words(page.path, page.page, dpi=150, max_long_edge=le))
    plan = plan_tiles(whole.width, whole.height, text_px=h, truncated=False, limits=TileLimits.of(Settings()))
    bo = {k: opts[k] for k in ("dpi", "max_long_edge", "image_format", "max_image_pixels")}
    tiles = [reader.read(render_band(page.path, DocumentKind.PDF, page.page, b, zoom=plan.zoom, **bo), "", 0) for b in plan.bands]
    reader.close()
truth = leaders_as_one(reading_truth(page.path, page.page, page.columns))
text, seams = stitch([t.text for t in tiles])
open("/tmp/dbg_whole.txt","w").write(a.text)
open("/tmp/dbg_stitched.txt","w").write(text)
open("/tmp/dbg_truth.txt","w").write(truth)
for i,t in enumerate(tiles): open(f"/tmp/dbg_tile{i}.txt","w").write(t.text)
print(seams, cer(truth, leaders_as_one(a.text)), cer(truth, leaders_as_one(text)))
print("tile cers", [cer(truth, leaders_as_one(t.text)) for t in tiles])
