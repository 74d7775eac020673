// The MPI calls this program makes, for exactly one process: the NO_MPI=1 build (one GPU, or the
// CPU, on a machine without Open MPI). Every collective over one rank is a copy; a point-to-point
// call has no peer and is an error.
#ifndef LLMC_MPI_SINGLE_H
#define LLMC_MPI_SINGLE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int MPI_Comm;
typedef int MPI_Datatype;   // the size of one element in bytes
typedef int MPI_Op;
typedef int MPI_Request;
typedef int MPI_Info;
typedef struct { int unused; } MPI_Status;
#define MPI_COMM_WORLD 0
#define MPI_COMM_TYPE_SHARED 0
#define MPI_INFO_NULL 0
#define MPI_BYTE 1
#define MPI_CHAR 1
#define MPI_INT 4
#define MPI_FLOAT 4
#define MPI_DOUBLE 8
#define MPI_SUM 0
#define MPI_MIN 1
#define MPI_MAX 2
#define MPI_IN_PLACE ((void *)1)
#define MPI_UNDEFINED (-32766)
#define MPI_STATUS_IGNORE ((MPI_Status *)0)
#define MPI_STATUSES_IGNORE ((MPI_Status *)0)

static int mpi_single_initialized = 0;
static int MPI_Init(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");   // launched by mpirun with several ranks?
    if (n == NULL) { n = getenv("PMI_SIZE"); }
    if (n != NULL && atoi(n) > 1) {
        fprintf(stderr,
                "error: this binary was built with NO_MPI=1 (one process) but launched as %s ranks: rebuild without "
                "NO_MPI\n", n);
        exit(1);
    }
    mpi_single_initialized = 1;
    return 0;
}
static int MPI_Initialized(int *flag) { *flag = mpi_single_initialized; return 0; }
static int MPI_Finalize(void) { mpi_single_initialized = 0; return 0; }
static int MPI_Abort(MPI_Comm c, int code) { (void)c; exit(code); }
static int MPI_Comm_size(MPI_Comm c, int *size) { (void)c; *size = 1; return 0; }
static int MPI_Comm_rank(MPI_Comm c, int *rank) { (void)c; *rank = 0; return 0; }
static int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out) {
    (void)c;
    (void)color;
    (void)key;
    *out = 0;
    return 0;
}
static int MPI_Comm_split_type(MPI_Comm c, int type, int key, MPI_Info info, MPI_Comm *out) {
    (void)c; (void)type; (void)key; (void)info; *out = 0; return 0;
}
static int MPI_Comm_free(MPI_Comm *c) { (void)c; return 0; }
static int MPI_Barrier(MPI_Comm c) { (void)c; return 0; }
static int MPI_Bcast(void *buf, int n, MPI_Datatype t, int root, MPI_Comm c) {
    (void)buf;
    (void)n;
    (void)t;
    (void)root;
    (void)c;
    return 0;
}
// one rank: the result is the input
static int mpi_single_copy(const void *send, void *recv, int n, MPI_Datatype t) {
    if (send != MPI_IN_PLACE && send != recv) { memmove(recv, send, (size_t)n * t); }
    return 0;
}
static int MPI_Allreduce(const void *send, void *recv, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    (void)op; (void)c; return mpi_single_copy(send, recv, n, t);
}
static int MPI_Reduce_scatter_block(const void *send, void *recv, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
    (void)op; (void)c; return mpi_single_copy(send, recv, n, t);
}
static int MPI_Allgather(const void *send, int n, MPI_Datatype t, void *recv, int rn, MPI_Datatype rt, MPI_Comm c) {
    (void)rn; (void)rt; (void)c; return mpi_single_copy(send, recv, n, t);
}
static int MPI_Gather(const void *send, int n, MPI_Datatype t, void *recv, int rn, MPI_Datatype rt, int root,
                      MPI_Comm c) {
    (void)rn; (void)rt; (void)root; (void)c; return mpi_single_copy(send, recv, n, t);
}
static int MPI_Reduce(const void *send, void *recv, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm c) {
    (void)op; (void)root; (void)c; return mpi_single_copy(send, recv, n, t);
}
static int MPI_Iallreduce(const void *send, void *recv, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Request *r) {
    *r = 0; return MPI_Allreduce(send, recv, n, t, op, c);
}
static int MPI_Ireduce_scatter_block(const void *send, void *recv, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                     MPI_Request *r) {
    *r = 0; return MPI_Reduce_scatter_block(send, recv, n, t, op, c);
}
static int MPI_Iallgather(const void *send, int n, MPI_Datatype t, void *recv, int rn, MPI_Datatype rt, MPI_Comm c,
                          MPI_Request *r) {
    *r = 0; return MPI_Allgather(send, n, t, recv, rn, rt, c);
}
static int MPI_Wait(MPI_Request *r, MPI_Status *s) { (void)r; (void)s; return 0; }
static int MPI_Alltoallv(const void *send, const int *sc, const int *so, MPI_Datatype t, void *recv, const int *rc,
                         const int *ro, MPI_Datatype rt, MPI_Comm c) {
    (void)rc; (void)rt; (void)c;
    memmove((char *)recv + (size_t)ro[0] * t, (const char *)send + (size_t)so[0] * t, (size_t)sc[0] * t);
    return 0;
}
static int MPI_Send(const void *buf, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c) {
    (void)buf; (void)n; (void)t; (void)tag; (void)c;
    fprintf(stderr, "error: MPI_Send to rank %d in a build without MPI (NO_MPI=1 runs one process)\n", peer);
    exit(1);
}
static int MPI_Issend(const void *buf, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *r) {
    (void)r;
    return MPI_Send(buf, n, t, peer, tag, c);
}
static int MPI_Recv(void *buf, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Status *s) {
    (void)buf; (void)n; (void)t; (void)tag; (void)c; (void)s;
    fprintf(stderr, "error: MPI_Recv from rank %d in a build without MPI (NO_MPI=1 runs one process)\n", peer);
    exit(1);
}

static int MPI_Irecv(void *buf, int n, MPI_Datatype t, int peer, int tag, MPI_Comm c, MPI_Request *r) {
    (void)r;
    return MPI_Recv(buf, n, t, peer, tag, c, NULL);
}
static int MPI_Waitall(int n, MPI_Request *r, MPI_Status *s) { (void)n; (void)r; (void)s; return 0; }
// errors: one process has no peer to disagree with; the handler is never called
typedef int MPI_Errhandler;
typedef void MPI_Comm_errhandler_function(MPI_Comm *, int *, ...);
#define MPI_MAX_ERROR_STRING 256
static int MPI_Comm_create_errhandler(MPI_Comm_errhandler_function *f, MPI_Errhandler *e) { (void)f; *e = 0; return 0; }
static int MPI_Comm_set_errhandler(MPI_Comm c, MPI_Errhandler e) { (void)c; (void)e; return 0; }
static int MPI_Error_string(int code, char *s, int *len) { *len = snprintf(s, MPI_MAX_ERROR_STRING, "error %d", code); return 0; }

#endif
