#!/usr/bin/env bash
# Releases every published module of the repository at one version, as River does: the
# modules' requirements on each other are set to that version (no replace directives: go.work
# ties them together for development), the change is committed, and every module is tagged
# at that commit — "vX.Y.Z" for the root module, "<dir>/vX.Y.Z" for the others
# (adapters/pgx/vX.Y.Z, transports/sqs/vX.Y.Z…), which is how the go command finds a module
# in a subdirectory. Nothing is pushed: the script prints the push command.
#
# Usage: scripts/release.sh [--edit-only] vX.Y.Z[-pre]
#   --edit-only  only rewrite the go.mod files (no commit, no tags)
# Published modules: the root, adapters/*, transports/*, cmd/* (go install-able). docs/ and examples/* are not
# published; their requirements are set too, so that they stay accurate.
set -euo pipefail

edit_only=0
if [[ ${1:-} == --edit-only ]]; then edit_only=1; shift; fi
version=${1:-}
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
if [[ ! $version =~ $semver ]]; then
  echo "release.sh: want a version like v0.3.0 or v0.3.0-rc.1, got '${version}'" >&2
  exit 2
fi
if [[ ! $version =~ ^v[01]\. ]]; then
  echo "release.sh: $version needs a /vN module path suffix, which these modules do not have" >&2
  exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
base=$(awk '$1 == "module" {print $2}' go.mod)
mapfile -t dirs < <(scripts/modules.sh | sed 's#^\./##; s#^\.$#.#')

published=()
for d in "${dirs[@]}"; do
  case $d in .|adapters/*|transports/*|cmd/*) published+=("$d") ;; esac
done

if ((!edit_only)); then
  if [[ -n $(git status --porcelain) ]]; then
    echo "release.sh: the working tree has changes; commit or stash them first" >&2
    exit 1
  fi
  for d in "${published[@]}"; do
    tag=$version; [[ $d == . ]] || tag=$d/$version
    if git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
      echo "release.sh: tag $tag exists already" >&2
      exit 1
    fi
  done
fi

# pkg.go.dev shows a module's license only from its own directory.
for d in "${published[@]}"; do
  [[ $d == . ]] || cmp -s LICENSE "$d/LICENSE" || { echo "release.sh: $d/LICENSE is missing or differs from LICENSE" >&2; exit 1; }
done

# Every requirement on one of our modules goes to $version; their replace directives go.
for d in "${dirs[@]}"; do
  mod=$d/go.mod
  self=$(awk '$1 == "module" {print $2}' "$mod")
  args=()
  # Our module paths named in go.mod: required ("path vX" in a require line or block), or
  # only replaced.
  while read -r p; do
    [[ $p == "$self" ]] && continue
    args+=("-dropreplace=$p")
  done < <(grep -oE "$base(/[A-Za-z0-9._/-]+)?" "$mod" | sort -u)
  while read -r p; do
    [[ $p == "$self" ]] && continue
    args+=("-require=$p@$version")
  done < <(awk -v base="$base" '
    $1 == "require" && $2 != "(" {print $2; next}
    $1 == "require" {inreq = 1; next}
    inreq && $1 == ")" {inreq = 0; next}
    inreq {print $1}' "$mod" | grep -E "^$base(/|$)" | sort -u)
  if ((${#args[@]})); then go mod edit "${args[@]}" "$mod"; fi
done
# go.work points $version of every published module at its directory: the go command reads
# the go.mod of every required version, also of a workspace module, and $version may not
# be published yet (it is not, until the tags are pushed).
mapfile -t old < <(go work edit -json go.work | awk -v base="$base" '
  /"Old": \{/ {inold = 1; next}
  inold && /"Path":/ {gsub(/[",]/, "", $2); path = $2; next}
  inold && /"Version":/ {gsub(/[",]/, "", $2); if (index(path, base) == 1) print path "@" $2; inold = 0; next}
  inold && /\}/ {inold = 0}')
args=()
for pv in "${old[@]}"; do args+=("-dropreplace=$pv"); done
for d in "${published[@]}"; do
  p=$base; [[ $d == . ]] || p=$base/$d
  args+=("-replace=$p@$version=./${d#.}")
done
go work edit "${args[@]}" go.work
echo "go.mod files: every requirement on $base modules is now $version, without replace"
echo "go.work: $version of each published module is its directory"
((edit_only)) && exit 0

if [[ -n $(git status --porcelain) ]]; then
  git commit -q -am "Release $version: every module requires the others at $version"
fi
tags=()
for d in "${published[@]}"; do
  tag=$version; [[ $d == . ]] || tag=$d/$version
  git tag -a -m "$base${d#.} $version" "$tag"
  tags+=("$tag")
done
echo "tagged $(git rev-parse --short HEAD) as: ${tags[*]}"
echo "publish with: git push origin HEAD ${tags[*]}"
