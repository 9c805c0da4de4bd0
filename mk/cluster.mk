# The virtual cluster's test applications (issue 3) and the safe-socket
# stream checker (issue 4): C socket programs under test/apps/, built into
# build/apps/NAME.

CLUSTER_APPS    := jacobi farm stream addrs starve logcost urandom ctlwait ticket whoami
CLUSTER_APP_DEP := test/apps/common.c test/apps/common.h

BUILD_TARGETS += $(addprefix build/apps/,$(CLUSTER_APPS))

build/apps/%: test/apps/%.c $(CLUSTER_APP_DEP)
	@mkdir -p build/apps
	$(CC) $(CFLAGS_APP) -pthread -o $@ $< test/apps/common.c -lm
