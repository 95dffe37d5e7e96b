"""Families of file-tree tasks (category ``files``): each ``Prose -> (files, instruction, output, expected, compare)``;
a ``tree`` output is a folder whose files must end up exactly as expected. Worded by :mod:`.phrasing`."""

from __future__ import annotations

import json
from collections import Counter

from grader.suites.terminal_families.phrasing import WORDS, Prose, Task, compose, output_name, render, token

EXTENSIONS = ("txt", "csv", "log", "md", "json", "py")


def _tree(p: Prose, root: str, count: tuple[int, int], *, empty: float = 0.0, mixed_case: bool = False) -> dict[str, str]:
    """Files under ``root`` (path → text) of various sizes and extensions, some in subfolders; ``empty``: the share of
    empty files."""
    rng, out = p.rng, {}
    for i in range(rng.randint(*count)):
        stem = f"{rng.choice(WORDS)}{i}"
        if mixed_case:
            stem = "".join(c.upper() if rng.random() < 0.4 else c for c in stem)
        folder = rng.choice(["", "", f"{rng.choice(WORDS[:4])}/"])
        out[f"{root}/{folder}{stem}.{rng.choice(EXTENSIONS)}"] = "" if rng.random() < empty else (rng.choice(WORDS) + "\n") * rng.randint(1, 400)
    return out


def find_large_files(p: Prose) -> Task:
    """A tree's files: those over a size (strict or not), the k largest, or one extension's total bytes."""
    rng = p.rng
    files = _tree(p, "data", (8, 18))
    sizes = {path.removeprefix("data/"): len(text.encode()) for path, text in files.items()}
    intro = [p.pick("`/app/data/` holds files of many sizes, some in subfolders.", "Look at the files under /app/data (subfolders included).")]
    relative = p.pick("Paths relative to `/app/data` (like `alpha/x.txt`).", "Give each path relative to /app/data.")
    op = rng.choice(["over", "largest", "ext-total"])
    say, style = p.listing()
    out = output_name(rng, ("large", "sizes"), ".txt")
    if op == "over":
        n = sorted(sizes.values())[len(sizes) // 2]
        strict = rng.random() < 0.5
        expected = sorted(x for x, s in sizes.items() if (s > n if strict else s >= n))
        bound = p.more_than(n) if strict else p.at_least(n)
        asks = [p.pick(f"List the files whose size is {bound} bytes.", f"Which files are {bound} bytes long?"), relative, p.pick("Sorted in byte order (as `LC_ALL=C sort`).", "In `LC_ALL=C sort` order."), say]
    elif op == "largest":
        k = rng.randint(2, 4)
        ranked = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))
        expected = [x for x, _ in ranked[:k]]
        asks = [p.pick(f"Find the {p.num(k)} largest files.", f"Which {p.num(k)} files are biggest?"), relative,
                "The largest first; on equal sizes, by path.", say]
    else:
        ext = rng.choice(sorted({x.rsplit(".", 1)[1] for x in sizes}))
        expected = [str(sum(s for x, s in sizes.items() if x.endswith("." + ext)))]
        asks = [p.pick(f"What is the total size in bytes of the `.{ext}` files?", f"Add up the sizes (bytes) of every {ext} file."), "Write only the number."]
        return files, compose(p, files, intro, [*asks, p.output(out)]), out, expected[0], "lines"
    return files, compose(p, files, intro, [*asks, p.output(out)]), out, *render(expected, style)


def organize_by_extension(p: Prose) -> Task:
    """A flat folder sorted into per-extension subfolders (named three ways, perhaps one extension excepted), or one extension moved."""
    rng = p.rng
    files = {path.replace("/" + path.split("/")[1] + "/", "/") if path.count("/") > 1 else path: text for path, text in _tree(p, "inbox", (6, 14)).items()}
    files[f"inbox/{rng.choice(WORDS)}-notes"] = "no extension\n"
    names = [path.removeprefix("inbox/") for path in files]
    style = rng.choice(["ext", "upper", "suffix", "one"])
    exts = sorted({n.rsplit(".", 1)[1] for n in names if "." in n})
    if style == "one":
        ext = rng.choice(sorted({n.rsplit(".", 1)[1] for n in names if "." in n}))
        target = rng.choice(["archive", "moved", ext + "s"])
        expected = {(f"{target}/{n}" if n.endswith("." + ext) else n): files["inbox/" + n] for n in names}
        asks = [p.pick(f"Move every `.{ext}` file into a new folder `/app/inbox/{target}/`.", f"Put the {ext} files into the subfolder `{target}` of /app/inbox (create it)."),
                "Leave the other files where they are."]
    else:
        def folder(ext: str) -> str:
            return {"ext": ext, "upper": ext.upper(), "suffix": f"{ext}_files"}[style]
        kept = rng.choice(exts) if rng.random() < 0.85 else None  # most instances take a parameter
        expected = {(f"{folder(n.rsplit('.', 1)[1])}/{n}" if "." in n and not n.endswith(f".{kept}") else n): files["inbox/" + n] for n in names}
        how = {"ext": "named after the extension (`txt`, `csv`…, no dot)", "upper": "named after the extension in upper case (`TXT`, `CSV`…)",
               "suffix": "named `<extension>_files` (`txt_files`, `csv_files`…)"}[style]
        asks = [p.pick(f"Sort the files of `/app/inbox` into subfolders of it, {how}.", f"Move each file of /app/inbox into a folder inside /app/inbox {how}."),
                p.pick("A file without an extension stays where it is.", "Files that have no extension are not moved."), "File names and contents do not change."]
        if kept:
            asks.append(p.pick(f"Leave the `.{kept}` files where they are, though.", f"Exception: {kept} files are not moved."))
    intro = [p.pick("`/app/inbox/` is a flat folder of files of several kinds.", "Files of mixed types pile up in /app/inbox.")]
    return files, compose(p, files, intro, asks), "inbox", json.dumps(expected), "tree"


def rename_files(p: Prose) -> Task:
    """A folder's files renamed: to lower case (all or one extension's), an extension changed, or a prefix added."""
    rng = p.rng
    op = rng.choice(["lower", "ext", "prefix"])
    files = {path.replace("/" + path.split("/")[1] + "/", "/") if path.count("/") > 1 else path: text
             for path, text in _tree(p, "files", (5, 12), mixed_case=op == "lower").items()}
    names = [path.removeprefix("files/") for path in files]
    if op == "lower":
        only = rng.choice(sorted({n.rsplit(".", 1)[1] for n in names})) if rng.random() < 0.8 else None
        names_out = {n: n.lower() if only is None or n.endswith("." + only) else n for n in names}
        which = p.pick("every file", "each file") if only is None else p.pick(f"every `.{only}` file (only those)", f"the {only} files, and no others,")
        asks = [p.pick(f"Rename {which} of `/app/files` to its name in lower case.", f"In /app/files, make the names of {which} lower case."), "Contents stay the same."]
    elif op == "ext":
        old = rng.choice(sorted({n.rsplit(".", 1)[1] for n in names}))
        new = rng.choice([e for e in ("bak", "old", "text", "data") if e != old])
        names_out = {n: n[: -len(old)] + new if n.endswith("." + old) else n for n in names}
        asks = [p.pick(f"Change the extension of every `.{old}` file in /app/files to `.{new}`.", f"Rename the {old} files of `/app/files` so they end in `.{new}` instead."),
                "Other files keep their names."]
    else:
        ext = rng.choice(sorted({n.rsplit(".", 1)[1] for n in names}))
        prefix = rng.choice(["old_", "2024-", "draft-", "x_"])
        names_out = {n: prefix + n if n.endswith("." + ext) else n for n in names}
        asks = [p.pick(f"Prefix the name of each `.{ext}` file in /app/files with `{prefix}`.", f"Rename every {ext} file of `/app/files` by putting `{prefix}` in front of its name."),
                "Do not touch the other files."]
    if len(set(names_out.values())) < len(names_out) or all(k == v for k, v in names_out.items()):  # a clash or nothing to do: lower-case stems
        names_out = {n: "renamed-" + n for n in names}
        asks = [p.pick("Prefix the name of every file in `/app/files` with `renamed-`.", "Rename each file of /app/files to `renamed-<its name>`.")]
    expected = {names_out[n]: files["files/" + n] for n in names}
    intro = [p.pick("`/app/files/` holds some files.", "There is a folder of files at /app/files.")]
    return files, compose(p, files, intro, asks), "files", json.dumps(expected), "tree"


def file_inventory(p: Prose) -> Task:
    """A tree counted: files per extension or bytes per extension (JSON), or all files."""
    rng = p.rng
    files = _tree(p, "share", (8, 20), empty=0.1)
    sizes = {path.removeprefix("share/"): len(text.encode()) for path, text in files.items()}
    intro = [p.pick("`/app/share/` is a shared folder (with subfolders).", "Take stock of /app/share and everything below it.")]
    op = rng.choice(["per-ext", "count", "bytes-per-ext"])
    if op == "count":
        out = output_name(rng, ("count",), ".txt")
        asks = [p.pick("How many files does it hold, subfolders included?", "Count every file in it, at any depth."), "Write only the number.", p.output(out)]
        return files, compose(p, files, intro, asks), out, str(len(sizes)), "lines"
    out = output_name(rng, ("inventory", "by_extension"), ".json")
    per = Counter()
    for path, size in sizes.items():
        per[path.rsplit(".", 1)[1]] += 1 if op == "per-ext" else size
    said = p.pick("how many files", "the number of files") if op == "per-ext" else p.pick("the total size in bytes", "how many bytes in all")
    asks = [f"For each file extension, find {said} (subfolders included).", p.pick("Write a JSON object from extension (no dot, like `txt`) to that number.",
                                                                               "The output is a JSON object: extension without the dot → number."), p.output(out)]
    return files, compose(p, files, intro, asks), out, json.dumps(dict(per)), "json"


def remove_empty_entries(p: Prose) -> Task:
    """Empty files, files under a size, one extension's empty files, or top-level empty files: deleted, or only listed."""
    rng = p.rng
    files = _tree(p, "work", (8, 16), empty=0.3)
    files[f"work/{rng.choice(WORDS)}-{token(rng, 3)}.txt"] = ""  # every rule below picks a set other than "all empty files"
    files[f"work/{rng.choice(WORDS[:4])}/{token(rng, 4)}.log"] = ""
    files[f"work/{token(rng, 5)}.md"] = "x\n"
    sizes = {path.removeprefix("work/"): len(text.encode()) for path, text in files.items()}
    intro = [p.pick("`/app/work/` holds files, some of them empty (zero bytes).", "Some files under /app/work are empty.")]
    rule = rng.choice(["empty", "small", "small", "ext", "ext", "top", "top"])  # most rules take a parameter
    if rule == "small":
        n = max(3, sorted(sizes.values())[len(sizes) // 3] + 1)
        doomed = {x for x, size in sizes.items() if size < n}
        said = p.pick(f"files of {p.below(n)} bytes", f"every file whose size is {p.below(n)} bytes")
    elif rule == "ext":
        ext = rng.choice(["txt", "log"])
        doomed = {x for x, size in sizes.items() if not size and x.endswith("." + ext)}
        said = p.pick(f"the empty `.{ext}` files", f"zero-byte files with the extension {ext} (and no others)")
    elif rule == "top":
        doomed = {x for x, size in sizes.items() if not size and "/" not in x}
        said = p.pick("the empty files directly in /app/work (not those in its subfolders)", "zero-byte files at the top level of `/app/work` only")
    else:
        doomed = {x for x, size in sizes.items() if not size}
        said = p.pick("every empty file, in subfolders too", "the zero-byte files at any depth")
    if rng.random() < 0.5:
        expected = {x: files["work/" + x] for x in sizes if x not in doomed}
        asks = [p.pick(f"Delete {said}.", f"Remove {said}."), "Leave every other file as it is."]
        return files, compose(p, files, intro, asks), "work", json.dumps(expected), "tree"
    out, (say, style) = output_name(rng, ("doomed", "to_delete"), ".txt"), p.listing()
    asks = [p.pick(f"List {said}, without deleting anything.", f"Which are {said}? Do not change them, just list them."),
            p.pick("Paths relative to `/app/work`, sorted in byte order (`LC_ALL=C sort`).", "Write their paths relative to /app/work, in `LC_ALL=C sort` order."),
            say, p.output(out)]
    return files, compose(p, files, intro, asks), out, *render(sorted(doomed), style)


FAMILIES = {"find-large-files": find_large_files, "organize-by-extension": organize_by_extension, "rename-files": rename_files,
            "file-inventory": file_inventory, "remove-empty-entries": remove_empty_entries}
"""Name → generator."""
