#!/usr/bin/env python3
"""arch_layers: every include in the library, the tools and the bindings respects the layers.

    python3 tests/arch/check_layers.py [--root DIR] [--table FILE]

The table of allowed dependencies is src/layers.txt (its comments give the format): one line
per module with its folder and what it may include. This script reads every C, C++, CUDA and
SWIG file (.c .cc .cpp .cxx .h .hh .hpp .hxx .inc .cu .cuh .i) under src/ and the module
folders outside src/ (cuda/, tools/, bindings/), finds each #include (and SWIG %include /
%import), resolves it as the compiler would (the including file's folder, then src/, the
repository root, include/, and for a module outside src/ its own folder) and prints one line
per include that breaks a rule:

    FILE:LINE: "HEADER" (RESOLVED): RULE

An include is allowed when it names a file of the including module, of a module its line
lists, a header its line lists, or a public header of the `public` line. Also reported: a
quoted include that resolves to no file of the repository (write the path of a header the
module may use, so no include escapes the check), an include built from a macro, and a
source file under src/ outside every module folder. Angle-bracket includes that resolve to
no file of the repository are system headers and are not checked. Comments are skipped;
code under #if 0 is checked like any other.

Names are checked too, since a header can bring another module's names in: in src/ and the
module folders outside it, a qualified name of another module's C++ namespace (`codec::Spec`,
`kvc::tier::Kind`, `using namespace kvc::prefix;`: the namespace of module M is kvc::M) is
reported unless the file's module may include that module (or one of its headers):

    FILE:LINE: the name "NS::..." of module T: RULE

Not scanned: tests/ (white-box tests may include any module's internals), docs/, bench/,
scripts/, and hidden or build folders (build*, target, dist, __pycache__, node_modules,
*.egg-info) inside the scanned ones.

Exit status: 0 no violation; 1 violations (listed); 2 the table or the arguments are wrong.
Python 3 standard library only.
"""
import argparse
import os
import re
import sys

SOURCE_EXTS = ('.c', '.cc', '.cpp', '.cxx', '.h', '.hh', '.hpp', '.hxx', '.inc', '.cu', '.cuh',
               '.i')
SKIP_DIRS = ('target', 'dist', '__pycache__', 'node_modules')
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*(?:include|include_next|import)\b[ \t]*(.*)$')
SWIG_RE = re.compile(r'^[ \t]*%[ \t]*(?:include|import)\b[ \t]*(.*)$')
TARGET_RE = re.compile(r'^(?:"([^"\n]+)"|<([^>\n]+)>)')
STRING_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')


class TableError(Exception):
    pass


class Module:
    def __init__(self, name, folder, lineno):
        self.name, self.folder, self.lineno = name, folder, lineno
        self.modules = []   # names of the modules it may include
        self.files = []     # repository-relative paths of single headers it may include
        self.specs = []     # those headers as the table names them


def rel(root, path):
    return os.path.relpath(path, root).replace(os.sep, '/')


def inside(path, folder):
    return path == folder or path.startswith(folder + '/')


def resolve_spec(root, spec):
    """A header named in the table: relative to src/, the repository root or include/."""
    for base in ('src', '', 'include'):
        p = os.path.normpath(os.path.join(root, base, spec))
        if os.path.isfile(p):
            return rel(root, os.path.realpath(p))
    return None


def read_table(root, path):
    modules, public, public_specs = {}, [], []
    lines = []
    with open(path, encoding='utf-8') as f:
        for lineno, line in enumerate(f, 1):
            words = line.split('#', 1)[0].split()
            if words:
                lines.append((lineno, words))
    for lineno, words in lines:
        if len(words) < 2:
            raise TableError('%s:%d: a line is "module folder [may include...]"' % (path, lineno))
        name, folder = words[0], words[1].strip('/')
        if name in modules or (name == 'public' and public_specs):
            raise TableError('%s:%d: %s is listed twice' % (path, lineno, name))
        if name == 'public':
            if folder != 'include':
                raise TableError('%s:%d: the public headers are in include/' % (path, lineno))
            public_specs = words[2:] or ['-']
            continue
        modules[name] = Module(name, folder, lineno)
    if not public_specs:
        raise TableError('%s: no `public` line (the headers every file may include)' % path)
    for lineno, words in lines:
        name = words[0]
        for item in words[2:]:
            if '/' in item:
                p = resolve_spec(root, item)
                if p is None:
                    raise TableError('%s:%d: %s names no file (relative to src/, the repository '
                                     'root or include/)' % (path, lineno, item))
                if name == 'public':
                    public.append(p)
                else:
                    modules[name].files.append(p)
                    modules[name].specs.append(item)
            elif name == 'public':
                raise TableError('%s:%d: the public line lists headers, not modules' %
                                 (path, lineno))
            elif item not in modules:
                raise TableError('%s:%d: %s is not a module of the table' % (path, lineno, item))
            else:
                modules[name].modules.append(item)
    for m in modules.values():
        for o in modules.values():
            if o is not m and (inside(o.folder, m.folder) or inside(m.folder, o.folder)):
                raise TableError('%s:%d: the folders of %s and %s overlap' %
                                 (path, m.lineno, m.name, o.name))
    return modules, public, public_specs


def strip_comments(text):
    """The text with comments blanked (newlines kept), strings and characters left alone."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '/' and text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif c == '/' and text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum()
                                                                       or text[i - 1] == '_')):
            m = re.match(r'R"([^()\\ \n]{0,16})\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(')' + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(text[i:j])
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def includes(path):
    """(line, quoted, name) of each include of a file; name None: a computed include."""
    with open(path, encoding='utf-8', errors='replace') as f:
        text = strip_comments(f.read())
    swig = path.endswith('.i')
    for lineno, line in enumerate(text.split('\n'), 1):
        m = INCLUDE_RE.match(line) or (SWIG_RE.match(line) if swig else None)
        if not m:
            continue
        t = TARGET_RE.match(m.group(1).strip())
        if t is None:
            yield lineno, True, None
        else:
            yield lineno, t.group(1) is not None, t.group(1) or t.group(2)


def qualified_names(path, namespaces):
    """(line, namespace) of each qualified use of one of the namespaces in a C/C++ file."""
    if path.endswith('.i'):
        return
    with open(path, encoding='utf-8', errors='replace') as f:
        text = STRING_RE.sub('""', strip_comments(f.read()))
    pat = re.compile(r'(?<![\w:])(?:::)?(?:kvc::)?(%s)::' % '|'.join(sorted(namespaces)))
    for lineno, line in enumerate(text.split('\n'), 1):
        if INCLUDE_RE.match(line):
            continue
        for m in pat.finditer(line):
            yield lineno, m.group(1)


def source_files(root, folder):
    top = os.path.join(root, folder)
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if not (
            d.startswith('.') or d.startswith('build') or d in SKIP_DIRS or
            d.endswith('.egg-info')))
        for fn in sorted(filenames):
            if fn.endswith(SOURCE_EXTS):
                yield os.path.join(dirpath, fn)


def module_of(modules, path):
    for m in modules.values():
        if inside(path, m.folder):
            return m
    return None


def listing(words):
    words = list(words)
    if not words:
        return 'nothing'
    return words[0] if len(words) == 1 else ', '.join(words[:-1]) + ' and ' + words[-1]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--root', default=os.path.normpath(os.path.join(here, '..', '..')),
                    help='the repository (default: the one holding this script)')
    ap.add_argument('--table', help='the table (default: ROOT/src/layers.txt)')
    args = ap.parse_args()
    root = os.path.realpath(args.root)
    table = args.table or os.path.join(root, 'src', 'layers.txt')
    table_name = rel(root, os.path.realpath(table))
    if table_name.startswith('../'):
        table_name = table
    try:
        modules, public, public_specs = read_table(root, table)
    except (OSError, TableError) as e:
        print('arch_layers: %s' % e, file=sys.stderr)
        return 2

    folders = ['src'] + sorted(m.folder for m in modules.values() if not inside(m.folder, 'src'))
    violations, n_files, n_includes = [], 0, 0
    for folder in folders:
        for path in source_files(root, folder):
            n_files += 1
            src = rel(root, path)
            m = module_of(modules, src)
            if m is None:
                violations.append((src, 0, '%s: outside every module folder of %s (add the '
                                   'module to the table or move the file)' % (src, table_name)))
                continue
            own_dir = os.path.dirname(path)
            # Names of modules the file's module may not use (the namespace kvc::<module>).
            for lineno, ns in qualified_names(path, [o.name for o in modules.values()]):
                t = modules[ns]
                if t is m or t.name in m.modules or any(inside(f, t.folder) for f in m.files):
                    continue
                violations.append((src, lineno, '%s:%d: the name "%s::..." of module %s: %s may '
                                   'use only %s' % (src, lineno, ns, t.name, m.name,
                                                    listing(m.modules + m.specs +
                                                            ['the public headers']))))
            for lineno, quoted, name in includes(path):
                n_includes += 1
                where = '%s:%d: ' % (src, lineno)
                if name is None:
                    violations.append((src, lineno, where + 'an include built from a macro: '
                                       'write the header\'s name so the layers can be checked'))
                    continue
                bases = ([own_dir] if quoted else []) + [os.path.join(root, 'src'), root,
                                                         os.path.join(root, 'include')]
                if not inside(m.folder, 'src'):
                    bases.append(os.path.join(root, m.folder))
                target = None
                for b in bases:
                    p = os.path.normpath(os.path.join(b, name))
                    if os.path.isfile(p):
                        target = rel(root, os.path.realpath(p))
                        break
                shown = '"%s"' % name if quoted else '<%s>' % name
                if target is None or target.startswith('../'):
                    if not quoted:
                        continue  # a system header
                    same = sorted(rel(root, q) for f in folders
                                  for q in source_files(root, f)
                                  if os.path.basename(q) == os.path.basename(name))[:3]
                    hint = ' (%s has that name)' % listing(same) if same else ''
                    looked = ['the including folder', 'src/', 'the repository root', 'include/']
                    if not inside(m.folder, 'src'):
                        looked.append(m.folder + '/')
                    violations.append((src, lineno, where + '%s: no such file in %s%s: name a '
                                       'header %s may include' %
                                       (shown, listing(looked), hint, m.name)))
                    continue
                n = '%s (%s)' % (shown, target) if target != name else shown
                if inside(target, 'include'):
                    if target in public or target in m.files:
                        continue
                    users = sorted(o.name for o in modules.values() if target in o.files)
                    violations.append((src, lineno, where + '%s: a public header only %s may '
                                       'include; every module may include %s' %
                                       (n, listing(users), listing(public_specs))))
                    continue
                t = module_of(modules, target)
                if t is None:
                    violations.append((src, lineno, where + '%s: outside every module of %s' %
                                       (n, table_name)))
                    continue
                if t is m or t.name in m.modules or target in m.files:
                    continue
                allowed = m.modules + m.specs + ['the public headers', 'its own files']
                if not any(t.name in o.modules for o in modules.values()) and not any(
                        inside(f, t.folder) for o in modules.values() for f in o.files):
                    rule = 'no module may include %s (%s)' % (t.name, t.folder)
                else:
                    rule = '%s may include only %s' % (m.name, listing(allowed))
                violations.append((src, lineno, where + '%s: %s -> %s: %s' %
                                   (n, m.name, t.name, rule)))

    for _, _, msg in sorted(violations):
        print(msg)
    if violations:
        print('arch_layers: %d violation(s) of %s in %d file(s) (%d files, %d includes checked)'
              % (len(violations), table_name, len({v[0] for v in violations}), n_files,
                 n_includes))
        return 1
    print('arch_layers: OK (%d files, %d includes checked against %s)' %
          (n_files, n_includes, table_name))
    return 0


if __name__ == '__main__':
    sys.exit(main())
