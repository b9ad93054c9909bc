"""Case directories on disk: case.json read as a Manifest, the checks it passes on the way in."""
