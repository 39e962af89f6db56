#!/usr/bin/env bash
# Builds the npm package of crates/web into crates/web/pkg/ (git-ignored): the release wasm32
# build of flint-web, its JS glue from wasm-bindgen (`--target web`: an ES module), and
# wasm-opt's size optimisation when Debian's binaryen is installed. The package itself is
# crates/web (package.json, js/flint.js and its types), which imports pkg/.
#
# wasm-bindgen-cli must be the version of the `wasm-bindgen` crate in Cargo.lock (the glue and
# the wasm file's custom sections must agree); it is installed from crates.io when missing or
# of another version.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if [ -z "$version" ]; then
  echo "build-web: no wasm-bindgen in Cargo.lock" >&2
  exit 1
fi
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }')" != "$version" ]; then
  echo "build-web: installing wasm-bindgen-cli $version from crates.io" >&2
  # --locked when its lock file resolves; a crates.io index without one of the locked versions
  # (a mirror's snapshot, a yanked crate) fails that, and then the newest compatible versions do.
  # The first attempt's errors are kept and shown only if the second fails too.
  locked_log=$(mktemp)
  if ! cargo install wasm-bindgen-cli --version "$version" --locked --quiet 2>"$locked_log"; then
    echo "build-web: its locked dependencies do not resolve on this registry; installing with the newest compatible ones" >&2
    if ! cargo install wasm-bindgen-cli --version "$version" --quiet; then
      echo "build-web: the locked install had failed with:" >&2
      cat "$locked_log" >&2
      rm -f "$locked_log"
      exit 1
    fi
  fi
  rm -f "$locked_log"
fi

rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
cargo build --quiet -p flint-web --target wasm32-unknown-unknown --release
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
out=crates/web/pkg
rm -rf "$out"
wasm-bindgen --target web --out-dir "$out" "$target_dir/wasm32-unknown-unknown/release/flint_web.wasm"

# Debian 12's binaryen (wasm-opt 108) breaks wasm-bindgen 0.2.130's table of JS references: the
# optimised module fails in Chromium with "WebAssembly.Table.set(): Argument 1 is invalid for
# table" (measured). Older versions than this are skipped; newer ones are not measured here,
# and the browser tests (scripts/test-web.sh) would catch a broken one.
wasm_opt_min=117
wasm_opt_version=$(wasm-opt --version 2>/dev/null | awk '{ print $3 }' || true)
if [ -n "$wasm_opt_version" ] && [ "$wasm_opt_version" -ge "$wasm_opt_min" ] 2>/dev/null; then
  # The features rustc's wasm32 target enables by default; wasm-opt must be told they are used.
  wasm-opt -O3 --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext \
    --enable-mutable-globals --enable-multivalue --enable-reference-types \
    "$out/flint_web_bg.wasm" -o "$out/flint_web_bg.wasm"
else
  echo "build-web: no wasm-opt $wasm_opt_min or newer (binaryen; found: ${wasm_opt_version:-none}); the .wasm file is not size-optimised" >&2
fi
echo "build-web: $out/flint_web_bg.wasm ($(du -h "$out/flint_web_bg.wasm" | cut -f1))" >&2
