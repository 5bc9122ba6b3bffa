/* LD_PRELOAD shim for the RocketMQ JVMs rmq.sh starts: a bind() to the wildcard address
 * (0.0.0.0 or ::) binds the loopback address (127.0.0.1 or ::1) instead, same port.
 *
 * Why: RocketMQ 5.5 has no bind-address setting for three of its listeners: the proxy's gRPC
 * server (GrpcServerBuilder: NettyServerBuilder.forPort), the proxy's remoting server
 * (RemotingProtocolServer sets only NettyServerConfig.listenPort, bindAddress stays 0.0.0.0) and
 * the broker's HA acceptor (DefaultHAService: new InetSocketAddress(haListenPort)). Every other
 * listener is configured to 127.0.0.1 already; this catches those three and any later one.
 * Explicit addresses are left alone. The JVMs run with -Djava.net.preferIPv4Stack=true, so in
 * practice only the AF_INET branch is taken.
 *
 * Built by rmq.sh with the system C compiler into .cache/rocketmq/; see README.md. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (real_bind == NULL) {
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
        if (real_bind == NULL) {
            errno = ENOSYS;
            return -1;
        }
    }
    if (addr != NULL && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in4;
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr != NULL && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (memcmp(&in6.sin6_addr, &in6addr_any, sizeof in6.sin6_addr) == 0) {
            in6.sin6_addr = in6addr_loopback;
            return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real_bind(fd, addr, len);
}
