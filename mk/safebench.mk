# The safe-socket benchmarks (test/safebench, `make bench`): their load,
# build/apps/netbench from test/apps/netbench.c, built by the build/apps/%
# rule of mk/cluster.mk (with test/apps/common.c).

BUILD_TARGETS += build/apps/netbench
