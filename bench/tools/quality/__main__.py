from bench import entry
from bench.tools.quality.sweep import main

raise SystemExit(entry.run(main))
