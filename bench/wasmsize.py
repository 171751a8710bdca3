#!/usr/bin/env python3
"""Size breakdown of a Go-built WebAssembly module: its sections, and the code
section by Go package and by function (names from the name section, so build
the module without -ldflags=-s for this). Standard library only.

    GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -buildvcs=false -o /tmp/b.wasm ./wasm
    python3 bench/wasmsize.py /tmp/b.wasm [packages=25] [functions=0]
"""
import collections
import re
import sys

SECTIONS = ['custom', 'type', 'import', 'function', 'table', 'memory', 'global', 'export', 'start',
            'element', 'code', 'data', 'datacount']


def leb(b, i):
    r = s = 0
    while True:
        x = b[i]
        i += 1
        r |= (x & 0x7f) << s
        s += 7
        if x < 0x80:
            return r, i


def package(name):
    # Go mangles "go.yaml.in/yaml/v3.(*parser).node" to "go.yaml.in_yaml_v3.__parser_.node".
    m = re.match(r'^((?:github\.com|go\.yaml\.in|golang\.org)[^.]*|type_|[^.]+)[.:]', name)
    return m.group(1) if m else name


def main():
    b = open(sys.argv[1], 'rb').read()
    npkg = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    nfun = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    i, secs, code, names, nimports = 8, [], [], {}, 0
    while i < len(b):
        sid = b[i]
        n, i = leb(b, i + 1)
        end = i + n
        if sid == 0:
            ln, j = leb(b, i)
            name = b[j:j + ln].decode()
            j += ln
            secs.append(('custom:' + name, n))
            while name == 'name' and j < end:
                sub = b[j]
                size, j = leb(b, j + 1)
                if sub == 1:  # function names
                    cnt, k = leb(b, j)
                    for _ in range(cnt):
                        idx, k = leb(b, k)
                        ln, k = leb(b, k)
                        names[idx] = b[k:k + ln].decode('utf-8', 'replace')
                        k += ln
                j += size
        else:
            secs.append((SECTIONS[sid], n))
        if sid == 2:  # imports: function indexes count them first
            cnt, j = leb(b, i)
            for _ in range(cnt):
                for _ in range(2):
                    ln, j = leb(b, j)
                    j += ln
                if b[j] != 0:
                    sys.exit('only function imports are handled')
                _, j = leb(b, j + 1)
                nimports += 1
        if sid == 10:
            cnt, j = leb(b, i)
            for f in range(cnt):
                size, k = leb(b, j)
                code.append((nimports + f, k - j + size))
                j = k + size
        i = end
    print('section                     bytes')
    for s, n in secs:
        print(f'{s:24} {n:>9,}')
    by, count = collections.Counter(), collections.Counter()
    for idx, size in code:
        p = package(names.get(idx, '?'))
        by[p] += size
        count[p] += 1
    total = sum(by.values())
    print(f'\ncode by package ({total:,} bytes, {len(code)} functions)')
    for p, s in by.most_common(npkg):
        print(f'{s:>9,} {100 * s / total:5.1f}% {count[p]:>5}  {p}')
    if nfun:
        print('\nlargest functions')
        for s, n in sorted(((s, names.get(i, '?')) for i, s in code), reverse=True)[:nfun]:
            print(f'{s:>9,}  {n}')


if __name__ == '__main__':
    main()
