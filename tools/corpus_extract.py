#!/usr/bin/env python3
"""Builds the demo model's training corpus from installed Debian packages (stdlib only).

Sources (all installed by tools/build_corpus.sh):
  code  : the Python 3.11 standard library source, /usr/lib/python3.11/**/*.py
  prose : the Python 3.11 HTML documentation, /usr/share/doc/python3.11/html/**/*.html
  zh    : Chinese manual pages (manpages-zh), /usr/share/man/zh_{CN,TW}/man*/*.gz

Output (in --out, default .corpus/): train_{code,prose,zh}.txt and heldout_{code,prose,zh}.txt,
documents separated by a line holding only DOC_SEPARATOR, plus SOURCES.txt (packages, versions,
licences, file counts, bytes, the split rule). The split is per source file and deterministic:
a file is held out when int(sha1(relative path)) % 1000 < HELDOUT_PER_MILLE.
"""

import argparse
import gzip
import hashlib
import html.parser
import os
import re
import subprocess
import sys

DOC_SEPARATOR = "<|endoftext|>"
HELDOUT_PER_MILLE = 20  # 2 % of the files
MAX_TOTAL_BYTES = 30 * 1000 * 1000

PY_LIB = "/usr/lib/python3.11"
PY_HTML = "/usr/share/doc/python3.11/html"
MAN_ZH = ["/usr/share/man/zh_CN", "/usr/share/man/zh_TW"]

PACKAGES = {
    "code": ["libpython3.11-minimal", "libpython3.11-stdlib"],
    "prose": ["python3.11-doc"],
    "zh": ["manpages-zh"],
}
# Licence summary per package, checked by hand against /usr/share/doc/<pkg>/copyright (the
# License: fields are also extracted automatically into SOURCES.txt).
LICENCE_SUMMARY = {
    "libpython3.11-minimal": "PSF-2.0 (Python Software Foundation License Version 2)",
    "libpython3.11-stdlib": "PSF-2.0 (Python Software Foundation License Version 2)",
    "python3.11-doc": "PSF-2.0 (Python documentation, same licence as Python)",
    "manpages-zh": "GFDL-1.2+ (a few pages GPL-2.0 / GPL-2.0+, see the copyright file)",
}

# Code files left out: generated tables and data that teach nothing about Python.
CODE_EXCLUDE = [
    re.compile(r"^encodings/(cp\d+|mac_\w+|iso8859_\d+|koi8_\w+|hp_roman8|ptcp154|palmos|tis_620|"
               r"kz1048|cp\w+)\.py$"),
    re.compile(r"^pydoc_data/"),
]
HTML_EXCLUDE = re.compile(r"(^|/)(genindex[^/]*|search|py-modindex)\.html$")


def is_heldout(rel_path):
    digest = hashlib.sha1(rel_path.encode("utf-8")).hexdigest()
    return int(digest, 16) % 1000 < HELDOUT_PER_MILLE


def walk_sorted(root, suffixes):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(suffixes):
                out.append(os.path.join(dirpath, name))
    out.sort()
    return out


# ----------------------------------------------------------------------------- code
def extract_code():
    docs = []
    for path in walk_sorted(PY_LIB, (".py",)):
        rel = os.path.relpath(path, PY_LIB)
        if rel.startswith(("site-packages/", "dist-packages/")):
            continue
        if any(p.search(rel) for p in CODE_EXCLUDE):
            continue
        with open(path, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        text = text.replace("\r\n", "\n").replace(DOC_SEPARATOR, "")
        if text.strip():
            docs.append(("python3.11/" + rel, "# " + rel + "\n" + text))
    return docs


# ----------------------------------------------------------------------------- prose
class SphinxText(html.parser.HTMLParser):
    """Text of the main content of a Sphinx page: block elements become line breaks,
    <pre> keeps its whitespace, header links and scripts are dropped."""

    BLOCK = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "tr", "br",
             "table", "ul", "ol", "dl", "blockquote", "section", "pre", "hr", "caption"}
    SKIP = {"script", "style", "head", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts = []
        self.main_depth = 0  # >0 while inside <div role="main">
        self.div_stack = []  # True for the div that opened main
        self.skip = 0
        self.pre = 0
        self.headerlink = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            opens_main = a.get("role") == "main" or "body" in (a.get("class") or "").split()
            opens_main = opens_main and self.main_depth == 0
            self.div_stack.append(opens_main)
            if opens_main or self.main_depth:
                self.main_depth += 1
        if not self.main_depth:
            return
        if tag in self.SKIP:
            self.skip += 1
        if tag == "a" and "headerlink" in (a.get("class") or ""):
            self.headerlink += 1
        if tag == "pre":
            self.pre += 1
        if tag in self.BLOCK:
            self.parts.append("\n")
        if tag in ("h1", "h2", "h3"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag == "div" and self.div_stack:
            self.div_stack.pop()
            if self.main_depth:
                self.main_depth -= 1
            return
        if not self.main_depth:
            return
        if tag in self.SKIP and self.skip:
            self.skip -= 1
        if tag == "a" and self.headerlink:
            self.headerlink -= 1
        if tag == "pre" and self.pre:
            self.pre -= 1
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.main_depth or self.skip or self.headerlink:
            return
        if self.pre:
            self.parts.append(data)
        else:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self):
        raw = "".join(self.parts)
        lines = [ln.rstrip() for ln in raw.split("\n")]
        out, blank = [], 0
        for ln in lines:
            if not ln.strip():
                blank += 1
                continue
            if blank and out:
                out.append("")
            blank = 0
            out.append(ln if ln.startswith("    ") or ln.startswith(">>>") else ln.strip()
                       if not ln.startswith(" ") else ln)
        return "\n".join(out).strip() + "\n"


def extract_prose():
    docs = []
    for path in walk_sorted(PY_HTML, (".html",)):
        rel = os.path.relpath(path, PY_HTML)
        if HTML_EXCLUDE.search(rel) or rel.startswith("_"):
            continue
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            parser = SphinxText()
            parser.feed(f.read())
            parser.close()
        text = parser.text().replace(DOC_SEPARATOR, "")
        if len(text) > 200:
            docs.append(("python3.11-doc/" + rel, text))
    return docs


# ----------------------------------------------------------------------------- zh
ROFF_CHARS = {"em": "\u2014", "en": "\u2013", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae",
              "aq": "'", "dq": '"', "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019",
              "hy": "-", "mi": "-", "pl": "+", "ti": "~", "ha": "^", "ga": "`", "bv": "|",
              "<=": "<=", ">=": ">=", "->": "->", "<-": "<-", "mu": "\u00d7", "de": "\u00b0"}
FONT_MACROS = {"B", "I", "SM", "SB"}
ALT_MACROS = {"BI", "IB", "BR", "RB", "IR", "RI"}


def roff_args(rest):
    """Splits a macro's arguments the way roff does: spaces separate, quotes group."""
    args, cur, quoted, i = [], [], False, 0
    while i < len(rest):
        c = rest[i]
        if c == '"':
            if quoted and i + 1 < len(rest) and rest[i + 1] == '"':
                cur.append('"')
                i += 2
                continue
            quoted = not quoted
        elif c in " \t" and not quoted:
            if cur:
                args.append("".join(cur))
                cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        args.append("".join(cur))
    return args


def roff_inline(s):
    s = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", s)  # font changes
    s = re.sub(r"\\s[+-]?\d", "", s)  # size changes
    s = re.sub(r"\\\*(\(..|\[[^\]]*\]|.)", "", s)  # string registers
    s = re.sub(r"\\n(\(..|\[[^\]]*\]|.)", "", s)  # number registers
    s = re.sub(r"\\\((..)", lambda m: ROFF_CHARS.get(m.group(1), ""), s)
    s = re.sub(r"\\\[([^\]]*)\]", lambda m: ROFF_CHARS.get(m.group(1), ""), s)
    s = s.replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ").replace("\\~", " ")
    s = re.sub(r"\\[&|^c%:)]", "", s)
    s = re.sub(r"\\(.)", r"\1", s)
    return s


def roff_to_text(src):
    out = []
    in_def = False
    for line in src.split("\n"):
        if in_def:
            if line.startswith(".."):
                in_def = False
            continue
        if line.startswith(('.\\"', "'\\\"", '.\\\\"')) or line.strip() in (".", "'"):
            continue
        if line.startswith((".", "'")):
            body = line[1:].strip()
            if not body:
                continue
            name, _, rest = body.partition(" ")
            if name in ("de", "de1", "am", "ig"):
                in_def = True
                continue
            args = roff_args(rest)
            if name in ("SH", "SS", "Sh"):
                out.append("")
                out.append(roff_inline(" ".join(args)))
            elif name in FONT_MACROS:
                out.append(roff_inline(" ".join(args)))
            elif name in ALT_MACROS:
                out.append(roff_inline("".join(args)))
            elif name in ("IP", "TP", "HP", "Ip"):
                out.append("")
                if args:
                    out.append(roff_inline(args[0]))
            elif name in ("PP", "P", "LP", "sp", "Sp", "br"):
                out.append("")
            continue
        out.append(roff_inline(line))
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


def extract_zh():
    docs = []
    for root in MAN_ZH:
        if not os.path.isdir(root):
            continue
        for path in walk_sorted(root, (".gz",)):
            rel = os.path.relpath(path, "/usr/share/man")
            if os.path.islink(path):
                continue
            with gzip.open(path, "rb") as f:
                raw = f.read()
            text = raw.decode("utf-8", errors="replace")
            if text.count("\ufffd") > 20 or text.lstrip().startswith(".so "):
                continue
            body = roff_to_text(text).replace(DOC_SEPARATOR, "")
            cjk = sum(1 for ch in body if "\u4e00" <= ch <= "\u9fff")
            if len(body) > 200 and cjk > 50:
                docs.append(("manpages-zh/" + rel, body))
    return docs


# ----------------------------------------------------------------------------- output
def dpkg_version(pkg):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not installed"


def licence_fields(pkg):
    path = "/usr/share/doc/%s/copyright" % pkg
    if not os.path.exists(path):
        return []
    seen = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"^License:\s*(\S.*)$", line)
            if m and len(m.group(1)) < 40 and m.group(1) not in seen:
                seen.append(m.group(1).strip())
    return seen


def write_split(out_dir, kind, docs, budget):
    train, held = [], []
    used = 0
    for rel, text in docs:
        n = len(text.encode("utf-8"))
        if used + n > budget:
            continue  # deterministic: skips files that overflow, keeps scanning in order
        used += n
        (held if is_heldout(rel) else train).append((rel, text))
    for name, part in (("train", train), ("heldout", held)):
        with open(os.path.join(out_dir, "%s_%s.txt" % (name, kind)), "w", encoding="utf-8") as f:
            for i, (_, text) in enumerate(part):
                if i:
                    f.write("\n" + DOC_SEPARATOR + "\n")
                f.write(text)
    return train, held


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".corpus")
    ap.add_argument("--stamp", default="", help="written into SOURCES.txt (idempotency check)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    budgets = {"code": 12_000_000, "prose": 12_500_000, "zh": 5_000_000}
    assert sum(budgets.values()) <= MAX_TOTAL_BYTES
    extractors = {"code": extract_code, "prose": extract_prose, "zh": extract_zh}
    lines = ["# tokenmill demo corpus (tools/build_corpus.sh)", "stamp: " + args.stamp,
             "document separator: a line holding only %s" % DOC_SEPARATOR,
             "split: per source file; held out when int(sha1(path), 16) %% 1000 < %d (about 2 %%)"
             % HELDOUT_PER_MILLE, ""]
    total = 0
    for kind in ("code", "prose", "zh"):
        docs = extractors[kind]()
        train, held = write_split(args.out, kind, docs, budgets[kind])
        tb = sum(len(t.encode("utf-8")) for _, t in train)
        hb = sum(len(t.encode("utf-8")) for _, t in held)
        total += tb + hb
        print("%-5s train %4d files %9d bytes | heldout %3d files %8d bytes"
              % (kind, len(train), tb, len(held), hb), file=sys.stderr)
        lines.append("[%s] train: %d files, %d bytes; heldout: %d files, %d bytes"
                     % (kind, len(train), tb, len(held), hb))
        for pkg in PACKAGES[kind]:
            lines.append("  package %s %s; licence: %s; copyright file License: fields: %s"
                         % (pkg, dpkg_version(pkg), LICENCE_SUMMARY[pkg],
                            ", ".join(licence_fields(pkg)) or "(free text, see file)"))
        lines.append("  heldout files: " + ", ".join(rel for rel, _ in held))
        lines.append("")
    lines.append("total bytes: %d" % total)
    assert total <= MAX_TOTAL_BYTES, total
    with open(os.path.join(args.out, "SOURCES.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
