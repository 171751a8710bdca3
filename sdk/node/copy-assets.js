// The `prepare` script: copies backstop.wasm (built by `make wasm`), the
// queue and idempotency scripts (Lua, and the PostgreSQL store's SQL) and the
// error-kinds table into this package from their one
// committed home, ../../contract, so `npm install` of this directory, `npm
// pack` and `npm publish` ship them without a second committed copy. Outside
// a checkout (an unpacked tarball) the copies the package carries are kept.
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const contract = join(here, '..', '..', 'contract');
const wasm = join(contract, 'backstop.wasm');
const scripts = join(contract, 'scripts');

// put replaces dst only when its bytes differ, through a rename, so a test
// loading the package meanwhile never reads a half-written file.
function put(src, dst) {
  const data = readFileSync(src);
  if (existsSync(dst) && readFileSync(dst).equals(data)) return;
  const tmp = `${dst}.${process.pid}.tmp`;
  writeFileSync(tmp, data);
  renameSync(tmp, dst);
}

if (existsSync(wasm) && existsSync(scripts)) {
  put(wasm, join(here, 'backstop.wasm'));
  const dir = join(here, 'scripts');
  mkdirSync(dir, { recursive: true });
  const lua = readdirSync(scripts).filter((f) => f.endsWith('.lua') || f.endsWith('.sql'));
  for (const f of readdirSync(dir)) {
    if ((f.endsWith('.lua') || f.endsWith('.sql')) && !lua.includes(f)) rmSync(join(dir, f)); // a script renamed or removed
  }
  for (const f of lua) put(join(scripts, f), join(dir, f));
  put(join(contract, 'errorkinds.json'), join(here, 'errorkinds.json'));
} else if (!existsSync(join(here, 'backstop.wasm')) || !existsSync(join(here, 'scripts', 'lib.lua'))) {
  console.error(`backstop-policy: ${wasm} or ${scripts} is missing: run \`make wasm\` at the repository root`);
  process.exit(1);
}
