/* sockio.h — raw socket helpers for the Go control plane (sockio.c). */
#ifndef RADIC_SOCKIO_H
#define RADIC_SOCKIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

int radic_sock_dial(uint32_t ip, uint16_t port, int timeout_ms);
int radic_sock_connect(int fd, uint32_t ip, uint16_t port, int timeout_ms);
int radic_sock_bound(uint32_t ip, uint16_t *port);
void radic_sock_disconnect(int fd);
/* Makes non-blocking fd's connect fail as the kernel fails one: refused
 * later (POLLOUT|POLLERR, SO_ERROR ECONNREFUSED), not at once. Returns
 * -errno of the connect made for it (-EINPROGRESS as a rule). */
int radic_sock_refuse(int fd);
int radic_sock_write_full(int fd, const void *p, size_t n, int timeout_ms);
int radic_sock_read_full(int fd, void *p, size_t n, int timeout_ms);
int radic_sock_peek(int fd, void *p, size_t n, int timeout_ms);
int radic_sock_name(int fd, int peer, uint32_t *ip, uint16_t *port);
int radic_sock_bind(int fd, uint32_t ip, uint16_t port);
int radic_addr_is_local(uint32_t ip);
int radic_sock_fill(void *sa, socklen_t *len, uint32_t ip, uint16_t port);
int radic_sock_listen(int fd, int backlog);
int radic_sock_dup(int fd);
/* Puts held's socket under fd, with fd's O_NONBLOCK and close-on-exec
 * (what the app's accept asked for), and closes held. */
int radic_sock_graft(int held, int fd);
void radic_sock_close(int fd);
int radic_sock_shutdown(int fd, int how);
int radic_sock_getfl(int fd);
int radic_sock_setopt(int fd, int level, int name, const void *val, socklen_t len);
void radic_log(const char *s);
void radic_set_lpid(const char *s);

/* A call argument that carries a pointer. */
static inline void *radic_arg_ptr(long v) { return (void *)v; }

#endif
