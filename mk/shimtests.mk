# Test programs of the shim suite (issue 2): C socket programs under
# test/progs/ and MPI programs under test/mpi/, used by test/shim/.
#
#   build/progs/NAME        from test/progs/NAME.c
#   build/mpi/ompi-NAME     from test/mpi/NAME.c with mpicc.openmpi
#   build/mpi/mpich-NAME    from test/mpi/NAME.c with mpicc.mpich
#
# fortify.c is built with -D_FORTIFY_SOURCE=2 so that glibc's __read_chk,
# __recv_chk and __recvfrom_chk are really called; the rule checks with nm.

SHIMTEST_PROGS := $(patsubst test/progs/%.c,build/progs/%,$(wildcard test/progs/*.c))
SHIMTEST_MPI   := $(patsubst test/mpi/%.c,%,$(wildcard test/mpi/*.c))
SHIMTEST_MPI_BINS := $(addprefix build/mpi/ompi-,$(SHIMTEST_MPI)) \
                     $(addprefix build/mpi/mpich-,$(SHIMTEST_MPI))

BUILD_TARGETS += $(SHIMTEST_PROGS) $(SHIMTEST_MPI_BINS)

SHIMTEST_HDR := test/progs/common.h
SHIMTEST_LIBS := -pthread

build/progs/%: test/progs/%.c $(SHIMTEST_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_APP) -o $@ $< $(SHIMTEST_LIBS)

build/progs/fortify: test/progs/fortify.c $(SHIMTEST_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS_APP) -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=2 -O2 -o $@ $< $(SHIMTEST_LIBS)
	@for s in __read_chk __recv_chk __recvfrom_chk; do \
		nm -D --undefined-only $@ | grep -qw "$$s" || \
		{ echo "$@: does not reference $$s (fortify not in effect)" >&2; rm -f $@; exit 1; }; \
	done

build/mpi/ompi-%: test/mpi/%.c
	@mkdir -p $(@D)
	mpicc.openmpi $(CFLAGS_APP) -o $@ $<

build/mpi/mpich-%: test/mpi/%.c
	@mkdir -p $(@D)
	mpicc.mpich $(CFLAGS_APP) -o $@ $<
