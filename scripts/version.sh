#!/usr/bin/env bash
# Prints the semantic version of the checkout it runs in (the current directory), from the nearest
# tag vMAJOR.MINOR.PATCH[-PRERELEASE] (`git describe --tags --match 'v*'`). The Makefile stamps it
# into both binaries. What it prints, so that versions sort as semver says builds were made:
#   on a tag v1.2.3                    v1.2.3
#   3 commits after v1.2.3             v1.2.4-dev.3+g<commit>     (after v1.2.3, before v1.2.4)
#   3 commits after v1.2.3-rc.1        v1.2.3-rc.1.dev.3+g<commit> (after rc.1, before rc.2)
#   no tag at all                      v0.0.0-dev.<commits>+g<commit>
#   uncommitted changes                build metadata "dirty" added (v1.2.3+dirty, ...+g<commit>.dirty)
#   not a git checkout                 v0.0.0-dev+unknown
# A tag that starts with v but is not semver is an error naming it, not a version built from it.
set -euo pipefail

if ! commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  echo v0.0.0-dev+unknown
  exit 0
fi
dirty=
# Untracked files do not count: a build's inputs are tracked files.
if ! git diff --quiet HEAD -- 2>/dev/null; then
  dirty=dirty
fi

semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
if desc=$(git describe --tags --match 'v*' --long --abbrev=12 2>/dev/null); then
  # <tag>-<commits since>-g<commit>; the tag itself may contain dashes.
  rest=${desc%-g*}
  n=${rest##*-}
  tag=${rest%-*}
  if ! [[ $tag =~ $semver ]]; then
    echo "scripts/version.sh: tag $tag is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE]" >&2
    exit 1
  fi
  if [ "$n" = 0 ]; then
    echo "$tag${dirty:++$dirty}"
    exit 0
  fi
  if [ -n "${BASH_REMATCH[4]}" ]; then
    echo "$tag.dev.$n+g$commit${dirty:+.$dirty}"
  else
    echo "v${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.$((BASH_REMATCH[3] + 1))-dev.$n+g$commit${dirty:+.$dirty}"
  fi
  exit 0
fi
echo "v0.0.0-dev.$(git rev-list --count HEAD)+g$commit${dirty:+.$dirty}"
