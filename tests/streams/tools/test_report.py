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
from streams.core.records import DeadLetter
from streams.tools.report import (
    NOT_RECORDED,
    KafkaFacts,
    LengthCounts,
    _Totals,
    build_report,
    distribution,
    letter_source,
    sample_lengths,
    think_close_id,
    token_frequencies,
)
from streams.tools.report_render import figures, plots, render_html

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
        f"tokenizer directory {tmp_path / 'gone'} is not on this machine (give --tokenizer-dir)",
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
    store.write_shard(
        1,
        0,
        0,
        [row("d", 4, 2, 2, source="code", drift=False)],
        drops={"x": "policy_length", "y": "policy_length", "z": "bad_token_ids"},
    )
    return store


def test_the_report_counts_what_the_shards_and_markers_hold(store: ShardStore) -> None:
    report = build_report(DatasetReader(store), think_close=CLOSE, split_note="test")
    assert (report["samples"], report["tokens"], report["loss_tokens"]) == (4, 42, 28)
    assert report["loss_fraction"] == round(28 / 42, 4)
    chat, code = report["by_source"]["chat"], report["by_source"]["code"]
    assert set(report["by_source"]) == {"chat", "code"}
    assert (chat["samples"], chat["tokens"], chat["loss_tokens"]) == (2, 26, 18)
    assert (code["samples"], code["tokens"], code["loss_tokens"]) == (2, 16, 10)
    # per-source lengths: chat has a (12 tokens) and c (14), code b (8) and d (8)
    assert (chat["mean_length"], chat["max_length"], code["p50_length"]) == (13.0, 14, 8.0)
    assert (chat["mean_generated"], code["max_generated"]) == (9.0, 6)
    # without the broker the source of a dropped prompt is unknown
    assert chat["drop_rate"] == NOT_RECORDED
    assert report["finish_reasons"] == {"stop": 3, "tool_calls": 1}
    lengths = report["lengths"]
    assert (lengths["prompt"]["min"], lengths["prompt"]["max"]) == (2, 5)
    assert lengths["reasoning"]["count"] == 3 and lengths["reasoning"]["max"] == 10
    assert sum(lengths["total"]["histogram"]["counts"]) == 4
    assert report["reasoning_split"]["samples_without_think_close"] == 1
    assert report["drift"] == {"compared": 4, "drifted": 1, "rate": 0.25, "causes": {TURN: 1}}
    assert report["truncated"] == 1
    assert report["duplicates"]["duplicate_ids_in_version"] == 0
    # the version's own drops are in its markers: recorded without a broker
    assert report["policy_drops"]["by_kind"] == {"policy_length": 2}
    assert report["errors"]["tokenize"]["by_kind"] == {"tokenize/bad_token_ids": 1}
    assert report["outcomes"] == {
        "prompts": 7,
        "samples": 4,
        "policy_drops": 2,
        "tokenize_errors": 1,
        "upstream_letters": NOT_RECORDED,
    }
    # the stages before tokenize are known only to the broker
    assert report["errors"]["upstream"]["by_kind"] == NOT_RECORDED
    assert report["errors"]["total"] == NOT_RECORDED
    assert set(report["not_recorded"]) == {
        "by_source.drop_rate",
        "errors.upstream",
        "duplicates.excluded_by_seal",
        "duplicates.removed_by_tokenize",
    }
    # supervised tokens: a 3 (reasoning filler 2) ... counted where the mask is 1
    tokens = report["supervised_tokens"]
    assert tokens["total"] == 28
    top = {row["id"]: row["count"] for row in tokens["top"]}
    # reasoning filler 2: 3+0+9+1, </think>: 1+0+1+1, answers 3: 3+6+1+2
    assert top == {2: 13, 3: 12, CLOSE: 3}
    assert [row["id"] for row in tokens["top"]] == [2, 3, CLOSE]
    unsplit = build_report(DatasetReader(store), think_close=None, split_note="no tokenizer")
    assert unsplit["lengths"]["reasoning"] is None
    assert "lengths.reasoning" in unsplit["not_recorded"]


def letter(stage: str, kind: str, prompt_id: str | None, source: str, **extra: Any) -> DeadLetter:
    payload = orjson.dumps({"prompt_id": prompt_id, "source": source})
    return DeadLetter.for_payload(stage, kind, "why", payload, prompt_id, **extra)


def test_drops_and_errors_are_the_versions_and_the_earlier_stages(store: ShardStore) -> None:
    facts = KafkaFacts(tokenize_workers=1, duplicates=5)
    letters = [
        # this version's drops, with the source their payload names
        letter("tokenize", "policy_length", "x", "chat"),
        letter("tokenize", "policy_length", "y", "code"),
        letter("tokenize", "bad_token_ids", "z", "code"),
        # another version's drop under the same prefix: not this version's
        letter("tokenize", "policy_empty_answer", "other", "chat"),
        # the earlier stages: shared by every version
        letter("generate", "retries_exhausted", "g", "chat"),
        DeadLetter.for_payload("publish", "not_json", "row 3", b"{oops", origin="/d/code:3"),
    ]
    for one in letters:
        facts.dead_letters[(one.stage, one.kind)] += 1
        facts.note(one)
    quiet = build_report(DatasetReader(store), think_close=CLOSE, split_note="", kafka=KafkaFacts())
    # a broker without letters: no earlier errors (recorded); no heartbeat: removed unknown
    assert quiet["errors"]["upstream"]["by_kind"] == {}
    assert quiet["errors"]["total"] == 1
    assert quiet["duplicates"]["removed_by_tokenize"] == NOT_RECORDED
    report = build_report(DatasetReader(store), think_close=CLOSE, split_note="", kafka=facts)
    assert report["policy_drops"]["by_kind"] == {"policy_length": 2}  # not the other version's
    assert report["errors"]["by_kind"] == {
        "tokenize/bad_token_ids": 1,
        "generate/retries_exhausted": 1,
        "publish/not_json": 1,
    }
    assert report["errors"]["total"] == 3
    assert report["outcomes"]["upstream_letters"] == 2
    assert report["duplicates"]["removed_by_tokenize"] == 5
    chat, code = report["by_source"]["chat"], report["by_source"]["code"]
    # chat: x and g dropped, 2 samples; code: y, z and the publish reject of its file
    assert (chat["drops"], chat["drop_rate"]) == (2, 0.5)
    assert report["by_source"]["/d/code"] == {"samples": 0, "drops": 1, "drop_rate": 1.0}
    assert (code["drops"], code["drop_rate"]) == (2, 0.5)
    assert "by_source.drop_rate" not in report["not_recorded"]

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
        "v1",
        0.0,
        [entry],
        samples=2,
        tokens=0,
        drops={"policy_empty_answer": 2, "oops": 1},
        dropped={"p": "policy_empty_answer", "q": "policy_empty_answer", "r": "oops"},
    )
    store._put(store.layout.sealed, manifest.encode())
    sealed = build_report(DatasetReader(store), think_close=CLOSE, split_note="", kafka=facts)
    assert sealed["samples"] == 2 and sealed["sealed"] is True
    assert sealed["policy_drops"]["by_kind"] == {"policy_empty_answer": 2}
    # a sealed version has its earlier stages' errors too (the letters, with the broker)
    assert sealed["errors"]["by_kind"] == {
        "tokenize/oops": 1,
        "generate/retries_exhausted": 1,
        "publish/not_json": 1,
    }
    assert sealed["duplicates"]["excluded_by_seal"] == 1
    assert sealed["drift"]["compared"] == 3  # the markers of the sealed shards only


def test_letter_sources_come_from_the_payload_or_the_rejected_rows_file() -> None:
    assert letter_source(letter("generate", "k", "p", "hf:org/set")) == "hf:org/set"
    reject = DeadLetter.for_payload("publish", "not_json", "m", b"\xff", origin="/a/b.jsonl:7")
    assert letter_source(reject) == "/a/b.jsonl"
    assert letter_source(DeadLetter.for_payload("tokenize", "k", "m", b"[]")) == "(unknown)"


def test_tick_labels_are_whole_numbers_that_do_not_overlap(store: ShardStore) -> None:
    report = build_report(DatasetReader(store), think_close=CLOSE, split_note="")
    # long tails and many sources, as real versions have them
    for name in ("prompt", "total"):
        report["lengths"][name]["histogram"]["edges"] = [round(x * 3277.5, 2) for x in range(41)]
        report["lengths"][name]["histogram"]["counts"] = [3] * 40
        report["lengths"][name]["p50"], report["lengths"][name]["p90"] = 5000.0, 90000.0
    report["by_source"] = {
        f"/data/some/long/path/source-{i:02d}.jsonl": {"samples": 7 * i + 1, "tokens": 123_456 * i}
        for i in range(25)
    }
    for name, figure in figures(report).items():
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        for axes in figure.axes:
            for axis in (axes.xaxis, axes.yaxis):
                labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
                boxes = [t.get_window_extent(renderer) for t in labels]
                for i, a in enumerate(boxes):
                    for b in boxes[i + 1 :]:
                        assert not a.overlaps(b), (name, labels)
                if axis.get_label_text() == "samples" or "per source" in axes.get_title():
                    continue
            counts = axes.yaxis if axes.get_ylabel() == "samples" else axes.xaxis
            if axes.get_ylabel() == "samples" or axes.patches:
                ticks = counts.get_majorticklocs()
                assert all(float(t).is_integer() for t in ticks), (name, ticks)


def test_token_frequencies_are_what_specforge_counts() -> None:
    rows = [
        SampleRow("a", "s", [9, 1, 4, 1, 3, 4], [0, 1, 1, 0, 1, 1], "stop", "server"),
        SampleRow("b", "s", [1, 4, 3, 1, 4, 1, 7], [1, 1, 1, 1, 1, 1, 0], "stop", "server"),
    ]
    totals = _Totals()
    totals.add(rows_to_table(rows), CLOSE)
    freqs = token_frequencies(totals.token_counts)
    assert list(freqs.items()) == [("1", 4), ("4", 4), ("3", 2)]  # ties: lower id first
    # SpecForge's own count (input_ids[loss_mask == 1] of every row) gives the same table
    expected: Counter[int] = Counter()
    for sample in rows:
        ids, mask = np.array(sample.input_ids), np.array(sample.loss_mask)
        expected.update(ids[mask == 1].tolist())
    assert {int(k): v for k, v in freqs.items()} == dict(expected)


def test_the_command_writes_json_pngs_and_a_self_contained_page(
    store: ShardStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "report"
    out = str(tmp_path / "out")
    argv = ["report", "--out", out, "--dataset", "v1", "--to", str(output)]
    assert main([*argv, "--tokenizer-dir", str(BUNDLED_QWEN36)]) == 0
    report = orjson.loads((output / "report.json").read_bytes())
    assert report["samples"] == 4 and report["reasoning_split"]["computed"] is True
    assert "not recorded: by_source.drop_rate, errors.upstream" in capsys.readouterr().out
    # the supervised-token table a trainer loads: token id -> count, most frequent first
    freqs = orjson.loads((output / "token_freq.json").read_bytes())
    assert freqs == {"2": 13, "3": 12, str(CLOSE): 3}
    assert report["supervised_tokens"]["top"][0]["token"]  # named by the tokenizer
    page = (output / "report.html").read_text()
    pattern = r'<img id="plot-([a-z_]+)" alt="[^"]*" src="data:image/png;base64,([^"]+)"'
    images = re.findall(pattern, page)
    assert [name for name, _ in images] == ["sources", "lengths", "finish_reasons", "policy_drops"]
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
    main(["report", "--out", str(tmp_path / "out"), "--dataset", "v1", "--to", str(output)])
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
    assert [name for name, *_ in probes] == ["sources", "lengths", "finish_reasons", "policy_drops"]
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


def made_by(recipe: str, thinking: bool, temperature: float, seed: int) -> str:
    sampling = {"temperature": temperature, "seed": seed}
    sampling["chat_template_kwargs"] = {"thinking": thinking}
    fields = {"recipe": recipe, "model": "kimi-k2.6", "thinking": thinking, "sampling": sampling}
    fields["served"] = {"kind": "sglang", "version": "0.5.9", "revision": "abc123"}
    return orjson.dumps(fields).decode()


def test_the_report_groups_samples_by_what_made_them_a_seed_aside(tmp_path: Path) -> None:
    store = ShardStore(str(tmp_path / "out"), "v1")
    store.write_manifest({"dataset": "v1"})
    rows = [
        row("a~0", 3, 2, 2, provenance=made_by("mix", True, 0.6, 1)),
        row("a~1", 3, 2, 2, provenance=made_by("mix", True, 0.6, 2)),  # its own seed
        row("b~0", 2, 0, 4, provenance=made_by("mix", False, 0.6, 1)),
        row("c", 2, 0, 1, provenance=made_by("mix", True, 1.0, 1)),
    ]
    store.write_shard(0, 0, 1, rows[:2])
    store.write_shard(1, 0, 2, [*rows[2:], row("old", 2, 0, 2)])  # written before the column
    report = build_report(DatasetReader(store), think_close=CLOSE, split_note="")
    section = report["provenance"]
    found = [
        (g["samples"], g["tokens"], g["provenance"] and g["provenance"]["sampling"])
        for g in section["groups"]
    ]
    thinking, plain = {"thinking": True}, {"thinking": False}
    assert found == [
        (2, 14, {"temperature": 0.6, "chat_template_kwargs": thinking}),
        # ties in the order of their keys: the unrecorded first
        (1, 4, None),
        (1, 6, {"temperature": 0.6, "chat_template_kwargs": plain}),
        (1, 3, {"temperature": 1.0, "chat_template_kwargs": thinking}),
    ]
    assert section["other"] == {"groups": 0, "samples": 0, "tokens": 0}
    page = render_html(report, plots(report))
    assert "<td>sglang 0.5.9 abc123</td><td>on</td><td>temperature=0.6</td>" in page
