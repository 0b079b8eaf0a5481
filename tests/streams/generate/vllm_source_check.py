# mypy: ignore-errors
# ruff: noqa
"""By hand, not collected: run released vLLM's own message parsing and tool models on draftgen's
normalization cases and the 41 bundled prompts, and compare with the vLLM profiles
(streams/core/serving/vllm.py), key order included, in both content formats.

    pip download --no-deps --only-binary=:all: -d /tmp/w vllm==0.34.0
    mkdir -p /tmp/vllm-wheels/0.34.0 && cd /tmp/vllm-wheels/0.34.0 && unzip -q /tmp/w/*.whl 'vllm/*'
    .venv/bin/python tests/streams/generate/vllm_source_check.py 0.34.0 vllm-0.33

vLLM's other imports are stubbed (no torch needed): only its request validation (the message
union of its chat_utils types), `_parse_chat_message_content`/`parse_chat_message_content`,
`_postprocess_messages` and `ChatCompletionToolsParam(...).model_dump()` run. Checked: 0.10.2,
0.11.0 (vllm-0.11); 0.12.0, 0.13.0, 0.19.0 (vllm-0.12); 0.20.0, 0.21.0 (vllm-0.20); 0.22.0,
0.28.0 (vllm-0.22); 0.29.0 (vllm-0.29); 0.30.0, 0.32.0 (vllm-0.30); 0.34.0 (vllm-0.33): 48
prompts each, no difference.
"""

import ast, sys, types, json, pathlib, typing, logging

sys.path.insert(0, str(pathlib.Path(__file__).parents[3]))
VERSION = sys.argv[1] if len(sys.argv) > 1 else "0.34.0"
PROFILE = sys.argv[2] if len(sys.argv) > 2 else "vllm-0.33"
ROOT = pathlib.Path(f"/tmp/vllm-wheels/{VERSION}")


class Anything:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return Anything()

    def __getattr__(self, n):
        return Anything()

    def __getitem__(self, k):
        return Anything()

    def __or__(self, o):
        return Anything()

    def __ror__(self, o):
        return Anything()

    def __mro_entries__(self, bases):
        return (object,)


class Stub(types.ModuleType):
    def __init__(self, name):
        super().__init__(name)
        self.__path__ = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Anything()


import importlib.abc, importlib.machinery


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "vllm" or name.startswith("vllm."):
            if name in sys.modules:
                return None
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return Stub(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, StubFinder())
for mod in [
    "vllm",
    "vllm.config",
    "vllm.exceptions",
    "vllm.inputs",
    "vllm.logger",
    "vllm.renderers",
    "vllm.renderers.chat_utils",
    "vllm.renderers.chat_utils.content_parser",
    "vllm.renderers.chat_utils.item_tracker",
]:
    sys.modules[mod] = Stub(mod)
sys.modules["vllm.logger"].init_logger = lambda n: logging.getLogger(n)


class VLLMValidationError(ValueError):
    def __init__(self, msg, **kw):
        super().__init__(msg)


sys.modules["vllm.exceptions"].VLLMValidationError = VLLMValidationError
cp = sys.modules["vllm.renderers.chat_utils.content_parser"]
cp.MODALITY_PLACEHOLDERS_MAP = {}
cp.PROMPT_EMBEDS_PLACEHOLDER_TOKEN = "<|pe|>"
cp.make_prompt_embeds_placeholder = lambda i: ""
# types.py for real (openai_harmony's Message: a model that no plain dict message matches)
from pydantic import BaseModel as _BM


class _Harmony(_BM):
    author: dict
    content: list


harmony = types.ModuleType("openai_harmony")
harmony.Message = _Harmony
sys.modules["openai_harmony"] = harmony


def load(name, path):
    src = path.read_text()
    m = types.ModuleType(name)
    m.__file__ = str(path)
    sys.modules[name] = m
    exec(compile(src, str(path), "exec"), m.__dict__)
    return m


if (ROOT / "vllm/renderers/chat_utils/types.py").exists():
    load("vllm.renderers.chat_utils.types", ROOT / "vllm/renderers/chat_utils/types.py")
    cm = load(
        "vllm.renderers.chat_utils.chat_message", ROOT / "vllm/renderers/chat_utils/chat_message.py"
    )
    T = sys.modules["vllm.renderers.chat_utils.types"]
    parse = cm.parse_chat_message_content
else:
    rel = (
        "vllm/renderers/chat_utils.py"
        if (ROOT / "vllm/renderers/chat_utils.py").exists()
        else "vllm/entrypoints/chat_utils.py"
    )
    cm = load("vllm.x.chat_utils", ROOT / rel)
    T = cm
    parse = cm._parse_chat_message_content


class Parser:
    model_config = types.SimpleNamespace(enable_prompt_embeds=False)

    def mm_placeholder_storage(self):
        return {}


class Tracker:
    def create_parser(self, **kw):
        return Parser()

    def get_num_items(self, m):
        return 0


def vllm_conversation(messages, content_format):
    # the request model's validation: the message union, as ChatCompletionRequest declares it
    from pydantic import BaseModel, ConfigDict

    class Req(BaseModel):
        model_config = ConfigDict(extra="allow")
        messages: list[T.ChatCompletionMessageParam]

    msgs = json.loads(json.dumps(messages))
    for m in msgs:  # ChatCompletionRequest._normalize_messages_before
        rc = m.pop("reasoning_content", None)
        if rc is not None and m.get("reasoning") is None:
            m["reasoning"] = rc
    validated = Req(messages=msgs).messages
    conv = []
    for m in validated:
        if isinstance(m.get("tool_calls"), typing.Iterator) or (
            m.get("tool_calls") is not None and not isinstance(m["tool_calls"], list)
        ):
            m["tool_calls"] = list(m["tool_calls"])
        conv.extend(parse(m, Tracker(), content_format, False))
    cm._postprocess_messages(conv)
    return conv


# tool models
ns = {}
exec(
    "from typing import Any, Literal, Optional, Union\nfrom pydantic import BaseModel, ConfigDict, model_validator, model_serializer\n"
    "class OpenAIBaseModel(BaseModel):\n    model_config = ConfigDict(extra='allow')\n",
    ns,
)
for path in [
    "vllm/entrypoints/generate/base/protocol.py",
    "vllm/entrypoints/openai/engine/protocol.py",
    "vllm/entrypoints/openai/protocol.py",
    "vllm/entrypoints/openai/chat_completion/protocol.py",
]:
    if not (ROOT / path).exists():
        continue
    tree = ast.parse((ROOT / path).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in (
            "FunctionDefinition",
            "ChatCompletionToolsParam",
        ):
            exec(compile(ast.Module([node], []), path, "exec"), ns)


def vllm_tools(tools):
    return [ns["ChatCompletionToolsParam"].model_validate(t).model_dump() for t in tools]


from streams.core.serving import PROFILES
from tests.streams.generate.normalization_cases import CASES
from streams.core.normalize import make_prompt_record
from tests.streams.generate.normalization_cases import SAMPLES

profile = PROFILES[PROFILE]
cases = dict(CASES)
for i, line in enumerate(SAMPLES.read_text().splitlines()):
    if line.strip():
        p = make_prompt_record(json.loads(line), "s")
        cases[f"sample{i}"] = types.SimpleNamespace(
            messages=p.messages, tools=p.tools, tool_choice="auto"
        )
bad = 0
for name, case in cases.items():
    for fmt in ("string", "openai"):
        ours = profile.messages(case.messages, fmt)
        theirs = vllm_conversation(case.messages, fmt)
        if json.dumps(ours) != json.dumps(theirs):  # key order too
            bad += 1
            print("MESSAGES differ", name, fmt, "\n ours  ", ours, "\n theirs", theirs)
    if case.tools:
        ours, theirs = profile.tools(case.tools, case.tool_choice), vllm_tools(case.tools)
        if json.dumps(ours) != json.dumps(theirs):
            bad += 1
            print("TOOLS differ", name, "\n ours  ", ours, "\n theirs", theirs)
print(f"{len(cases)} cases, {bad} differences")
