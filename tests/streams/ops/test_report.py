"""`draftgen report` on a `file://` store: the figures (lengths derived from the loss mask and
the `</think>` id, per-source counts, drift, drops and duplicates from what was recorded, the
rest "not recorded"), the files it writes, and the HTML page rendered by headless chromium."""

from __future__ import annotations

import base64
import html
import io
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from compose.tiny_tokenizers import BUNDLED_QWEN36
from sinks.manifest import SealedManifest, ShardEntry
from sinks.reader import DatasetReader
from sinks.shards import SampleRow, ShardStore, rows_to_table
from streams.cli.main import main
from streams.ops.report import (
    NOT_RECORDED,
    KafkaFacts,
    LengthCounts,
    build_report,
    distribution,
    sample_lengths,
    think_close_id,
)

CLOSE = 9  # the </think> id of these hand-made samples
REPO = Path(__file__).resolve().parents[3]
TURN = "turn: server '<|im_end|>' vs rendered (end)"


def row(pid: str, prompt: int, reasoning: int, answer: int, **extra: Any) -> SampleRow:
    """`prompt` tokens, then `reasoning` tokens ending with </think> (none if 0), then the
    answer; a </think> id in the prompt too, which is not the turn's."""
    ids = [CLOSE] + [1] * (prompt - 1) + [2] * (reasoning - 1) + [CLOSE] * bool(reasoning)
    ids += [3] * answer
    mask = [0] * prompt + [1] * (reasoning + answer)
    fields: dict[str, Any] = {"finish_reason": "stop", "token_source": "server", **extra}
    return SampleRow(pid, fields.pop("source", "chat"), ids, mask, **fields)


def test_lengths_come_from_the_mask_and_the_supervised_think_close() -> None:
    table = rows_to_table([row("a", 5, 4, 3), row("b", 2, 0, 6), row("c", 3, 10, 0)])
    lengths = sample_lengths(table, CLOSE)
    assert lengths["prompt"].tolist() == [5, 2, 3]
    assert lengths["generated"].tolist() == [7, 6, 10]
    assert lengths["total"].tolist() == [12, 8, 13]
    assert lengths["reasoning"].tolist() == [4, -1, 10]  # b: no </think> in its turn
    assert lengths["answer"].tolist() == [3, -1, 0]
    assert sample_lengths(table, None)["reasoning"].tolist() == [-1, -1, -1]
    # a rendered turn may end with unsupervised template tokens: not part of the prompt
    trailing = row("e", 4, 3, 2)
    trailing.input_ids = [*trailing.input_ids, 7]
    trailing.loss_mask = [*trailing.loss_mask, 0]
    lengths = sample_lengths(rows_to_table([trailing]), CLOSE)
    assert (lengths["prompt"][0], lengths["generated"][0], lengths["answer"][0]) == (4, 5, 2)
    # a sliced table (as filters and concatenation make them) gives the same figures
    sliced = pa.concat_tables([table.slice(1, 1), table.slice(2, 1)])
    assert sample_lengths(sliced, CLOSE)["reasoning"].tolist() == [-1, 10]


def test_the_think_close_id_comes_from_the_tokenizer_or_the_reason_why_not(tmp_path: Path) -> None:
    token_id, note = think_close_id(str(BUNDLED_QWEN36))
    tokenizer = orjson.loads((BUNDLED_QWEN36 / "tokenizer.json").read_bytes())
    by_content = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert token_id == by_content["</think>"] and "</think>" in note
    assert think_close_id(str(tmp_path / "gone")) == (
        None,
        f"tokenizer directory {tmp_path / 'gone'} is not on this machine (give --tokenizer)",
    )
    assert think_close_id(None)[0] is None


@pytest.fixture
def store(tmp_path: Path) -> ShardStore:
    store = ShardStore(str(tmp_path / "out"), "v1")
    store.write_manifest({"dataset": "v1", "tokenizer_dir": str(tmp_path / "elsewhere")})
    store.write_shard(
        0,
        0,
        2,
        [
            row("a", 5, 4, 3, drift=False),
            row(
                "b",
                2,
                0,
                6,
                source="code",
                finish_reason="tool_calls",
                drift=True,
                drift_cause=TURN,
            ),
            row("c", 3, 10, 1, drift=False, truncated=True),
        ],
    )
    store.write_shard(1, 0, 0, [row("d", 4, 2, 2, source="code", drift=False)])
    return store


def test_the_report_counts_what_the_shards_and_markers_hold(store: ShardStore) -> None:
    report = build_report(DatasetReader(store), think_close=CLOSE, split_note="test")
    assert (report["samples"], report["tokens"], report["loss_tokens"]) == (4, 42, 28)
    assert report["loss_fraction"] == round(28 / 42, 4)
    assert report["by_source"] == {
        "chat": {"samples": 2, "tokens": 26, "loss_tokens": 18},
        "code": {"samples": 2, "tokens": 16, "loss_tokens": 10},
    }
    assert report["finish_reasons"] == {"stop": 3, "tool_calls": 1}
    lengths = report["lengths"]
    assert (lengths["prompt"]["min"], lengths["prompt"]["max"]) == (2, 5)
    assert lengths["reasoning"]["count"] == 3 and lengths["reasoning"]["max"] == 10
    assert sum(lengths["total"]["histogram"]["counts"]) == 4
    assert report["reasoning_split"]["samples_without_think_close"] == 1
    assert report["drift"] == {"compared": 4, "drifted": 1, "rate": 0.25, "causes": {TURN: 1}}
    assert report["truncated"] == 1
    assert report["duplicates"]["duplicate_ids_in_version"] == 0
    # neither sealed nor given a broker: drops, errors and removed duplicates are unknown
    assert report["policy_drops"]["by_kind"] == NOT_RECORDED
    assert set(report["not_recorded"]) == {
        "policy_drops",
        "errors",
        "duplicates.excluded_by_seal",
        "duplicates.removed_by_tokenize",
    }
    unsplit = build_report(DatasetReader(store), think_close=None, split_note="no tokenizer")
    assert unsplit["lengths"]["reasoning"] is None
    assert "lengths.reasoning" in unsplit["not_recorded"]


def test_drops_and_duplicates_come_from_the_seal_or_the_broker(store: ShardStore) -> None:
    kafka = KafkaFacts(
        dead_letters=Counter(
            {("tokenize", "policy_length"): 3, ("generate", "retries_exhausted"): 1}
        ),
        policy_prompt_ids=3,
        tokenize_workers=1,
        duplicates=5,
    )
    quiet = build_report(DatasetReader(store), think_close=CLOSE, split_note="", kafka=KafkaFacts())
    # a broker without letters: no drops (recorded); no heartbeat: duplicates removed unknown
    assert quiet["policy_drops"]["by_kind"] == {} and quiet["errors"]["by_kind"] == {}
    assert quiet["duplicates"]["removed_by_tokenize"] == NOT_RECORDED
    report = build_report(DatasetReader(store), think_close=CLOSE, split_note="", kafka=kafka)
    assert report["policy_drops"]["by_kind"] == {"policy_length": 3}
    assert report["errors"]["by_kind"] == {"generate/retries_exhausted": 1}
    assert report["duplicates"]["removed_by_tokenize"] == 5
    marker = store.markers(0)[0]
    entry = ShardEntry(
        path="data/part-0000-000000000000-g00000000.arrow",
        partition=0,
        start_offset=0,
        end_offset=2,
        rows=3,
        sha256=marker.sha256,
        exclude=[0],
    )
    manifest = SealedManifest(
        "v1", 0.0, [entry], samples=2, tokens=0, drops={"policy_empty_answer": 2, "oops": 1}
    )
    store._put(store.layout.sealed, manifest.encode())
    sealed = build_report(DatasetReader(store), think_close=CLOSE, split_note="", kafka=kafka)
    assert sealed["samples"] == 2 and sealed["sealed"] is True
    assert sealed["policy_drops"]["by_kind"] == {"policy_empty_answer": 2}
    assert sealed["errors"]["by_kind"] == {"oops": 1}
    assert sealed["duplicates"]["excluded_by_seal"] == 1
    assert sealed["drift"]["compared"] == 3  # the markers of the sealed shards only


def test_the_command_writes_json_pngs_and_a_self_contained_page(
    store: ShardStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "report"
    out = str(tmp_path / "out")
    argv = ["report", "--out", out, "--dataset", "v1", "--output", str(output)]
    assert main([*argv, "--tokenizer", str(BUNDLED_QWEN36)]) == 0
    report = orjson.loads((output / "report.json").read_bytes())
    assert report["samples"] == 4 and report["reasoning_split"]["computed"] is True
    assert "not recorded: policy_drops" in capsys.readouterr().out
    page = (output / "report.html").read_text()
    pattern = r'<img id="plot-([a-z_]+)" alt="[^"]*" src="data:image/png;base64,([^"]+)"'
    images = re.findall(pattern, page)
    assert [name for name, _ in images] == ["sources", "lengths", "finish_reasons"]
    for name, data in images:
        png = base64.b64decode(data)
        assert png == (output / f"{name}.png").read_bytes()
        image = Image.open(io.BytesIO(png)).convert("L")
        assert image.width > 300 and image.getextrema()[0] < 128  # something dark is drawn
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # nothing fetched from elsewhere
    assert "<script" not in page
    assert f"<td>{html.escape(TURN)}</td><td>1</td>" in page  # the drift causes' table
    # the recorded tokenizer directory is not on this machine: the split is not computed
    assert main([*argv[:-1], str(tmp_path / "second")]) == 0
    second = orjson.loads((tmp_path / "second" / "report.json").read_bytes())
    assert second["reasoning_split"]["computed"] is False
    assert "is not on this machine" in second["reasoning_split"]["note"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    helper = subprocess.run(
        ["bash", str(REPO / "compose" / "ensure_chromium.sh")], capture_output=True, text=True
    )
    if helper.returncode != 0:
        pytest.skip(f"no chromium and it cannot be installed here: {helper.stderr.strip()}")
    return helper.stdout.strip()


# Appended to a copy of the page (the report itself has no script): after load, each <img> is
# drawn on a canvas (synchronously, so --virtual-time-budget covers it) and its dark pixels
# counted; --dump-dom then shows the figures.
PROBE = """<script>
window.addEventListener("load", () => {
  for (const img of document.images) {
    let ink = -1;
    try {
      const canvas = document.createElement("canvas");
      canvas.width = img.naturalWidth;
      canvas.height = img.naturalHeight;
      const context = canvas.getContext("2d");
      context.drawImage(img, 0, 0);
      const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
      ink = 0;
      for (let i = 0; i < pixels.length; i += 4) {
        if (pixels[i + 3] > 0 && pixels[i] + pixels[i + 1] + pixels[i + 2] < 3 * DARK) ink++;
      }
    } catch (error) {
      ink = -1;
    }
    const shown = Math.round(img.getBoundingClientRect().width);
    const size = `${img.naturalWidth}x${img.naturalHeight}`;
    img.setAttribute("data-probe", `${size} ${shown} ${ink}`);
  }
  document.body.setAttribute("data-probed", "yes");
});
</script>"""
DARK = 128


def dark_pixels(path: Path) -> int:
    pixels = np.asarray(Image.open(path).convert("RGBA")).astype(int)
    return int(((pixels[..., 3] > 0) & (pixels[..., :3].sum(axis=-1) < 3 * DARK)).sum())


def test_headless_chromium_renders_every_plot(store: ShardStore, tmp_path: Path) -> None:
    browser = _chromium()
    output = tmp_path / "report"
    main(["report", "--out", str(tmp_path / "out"), "--dataset", "v1", "--output", str(output)])
    page = (output / "report.html").read_text()
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE.replace("DARK", str(DARK)) + "</body>"))
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        probed.as_uri(),
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=120).stdout
    assert 'data-probed="yes"' in dom, dom[-2000:]
    probes = re.findall(r'<img id="plot-([a-z_]+)"[^>]*data-probe="(\d+)x(\d+) (\d+) (-?\d+)"', dom)
    assert [name for name, *_ in probes] == ["sources", "lengths", "finish_reasons"]
    for name, width, height, shown, ink in probes:
        png = output / f"{name}.png"
        assert (int(width), int(height)) == Image.open(png).size, name
        assert int(shown) > 100, f"{name} is not displayed"
        expected = dark_pixels(png)
        assert expected > 0 and abs(int(ink) - expected) <= expected * 0.02, (name, ink, expected)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(-1, 5000), max_size=40), max_size=5),
    st.integers(1, 50),
)
def test_lengths_counted_give_the_figures_of_the_lengths_themselves(
    shards: list[list[int]], bins: int
) -> None:
    """The report keeps how many samples have each length, not every sample's length (memory
    that does not grow with the version): its figures are those of the lengths themselves."""
    counts = LengthCounts()
    for values in shards:
        array = np.asarray(values, dtype=np.int64)
        counts.add({"total": np.abs(array), "reasoning": array})
    every = np.asarray([v for values in shards for v in values], dtype=np.int64)
    assert counts.distribution("total", bins) == distribution(np.abs(every), bins)
    assert counts.distribution("reasoning", bins) == distribution(every[every >= 0], bins)
    assert counts.unsplit == int((every < 0).sum())
