"""SSD write-amplification (WAF) study tools: a page-mapped FDP flash model (:mod:`.ftl`), its
analytic check (:mod:`.analytic`), an LMCache-shaped workload and its JSON-lines trace
(:mod:`.workload`), the cache model that turns a trace into the device's write stream per
placement mode (:mod:`.stream`), synthetic workload classes (:mod:`.classes`) and the study
(:mod:`.study`). Command line: ``python -m lmcache_rawblock waf --help``."""
