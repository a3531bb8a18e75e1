/* connbench: connect() latency and connection rate, without an interpreter in the loop.
 *
 *   connbench latency --base ADDR --port P (--index I | --random N) --connects C
 *                     [--cpu K] [--seed S] [--timeout-ms T]
 *   connbench rate    --base ADDR --port P (--index I | --random N) --seconds D
 *                     [--cpu K] [--seed S] [--timeout-ms T] [--request]
 *   connbench rr      --base ADDR --port P (--index I | --random N) --seconds D
 *                     --flows F [--new-connection] [--cpu K] [--seed S] [--timeout-ms T]
 *   connbench serve   --port P [--ipv6] [--cpu K] [--lifetime S] [--threads T]
 *
 * "Service i" is base + i + 1 (lab/bench/scenario.py), so no address table is needed.
 * ADDR is IPv4 or IPv6: clients connect over that family; the server listens on one family
 * (0.0.0.0, or :: IPv6-only with --ipv6), so an IPv4 run measures an IPv4 socket as before.
 * Clients print one JSON line; the server prints "ready" once listening and, when it
 * exits (SIGTERM/SIGINT or --lifetime), one JSON line of counters.
 * rr: F flows at once (a thread each), each a request and its response after another for
 * D seconds: on one connection per flow (TCP_RR), or a new connection per request with
 * --new-connection (TCP_CRR); transactions counted over all flows. The server answers
 * every request a connection sends until the client closes.
 * Built by lab/bench/loadgen.py: gcc -std=c11 -O2 -Wall -Wextra -Werror -pthread.
 * Over 400 lines: clients, server and options in the one source loadgen.py compiles.
 */
#define _GNU_SOURCE /* sched_setaffinity, strerrorname_np */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { MSG_SIZE = 16 }; /* request and response size: one small segment each way */
static const char REQUEST[MSG_SIZE] = "connbench-req..";
static const char RESPONSE[MSG_SIZE] = "connbench-resp.";

struct opts {
	int family;       /* AF_INET or AF_INET6: --base's (clients), --ipv6 (serve) */
	uint8_t base[16]; /* network byte order: the first 4 bytes for IPv4 */
	int port, cpu, index, random_n, connects, timeout_ms, threads, request, listen6;
	int flows, new_connection; /* rr */
	double seconds, lifetime;
	uint64_t seed;
};

static _Noreturn void die(const char *what)
{
	fprintf(stderr, "connbench: %s: %s\n", what, strerror(errno));
	exit(1);
}

static _Noreturn void usage(const char *msg)
{
	fprintf(stderr, "connbench: %s (see the comment at the top of connbench.c)\n", msg);
	exit(2);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu)
{
	cpu_set_t set;
	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0) /* 0: the calling thread */
		die("sched_setaffinity");
}

/* ---- client ----------------------------------------------------------------------- */

/* splitmix64: a few cycles per draw, good enough to pick services uniformly. */
static uint64_t next_random(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

struct client {
	const struct opts *o;
	uint64_t rng;
	long errors;
	char first_error[96];
};

/* addr (len bytes, network order) += v; nonzero if the sum leaves the address space. */
static int add_index(uint8_t *addr, int len, uint64_t v)
{
	unsigned carry = 0;
	for (int k = len - 1; k >= 0 && (v || carry); k--, v >>= 8) {
		unsigned sum = addr[k] + (unsigned)(v & 0xff) + carry;
		addr[k] = (uint8_t)sum;
		carry = sum >> 8;
	}
	return v || carry;
}

/* Service i's socket address: base + i + 1 in the options' family. */
static socklen_t service_address(const struct opts *o, uint32_t i, struct sockaddr_storage *to)
{
	memset(to, 0, sizeof(*to));
	if (o->family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)to;
		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)o->port);
		memcpy(&in->sin_addr, o->base, 4);
		add_index((uint8_t *)&in->sin_addr, 4, (uint64_t)i + 1);
		return sizeof(*in);
	}
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)to;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons((uint16_t)o->port);
	memcpy(&in6->sin6_addr, o->base, 16);
	add_index(in6->sin6_addr.s6_addr, 16, (uint64_t)i + 1);
	return sizeof(*in6);
}

static void note_error(struct client *c, int err)
{
	/* A blocking connect that hits SO_SNDTIMEO reports EINPROGRESS: call it a timeout. */
	if (err == EINPROGRESS || err == EAGAIN)
		err = ETIMEDOUT;
	if (c->errors++ == 0) {
		const char *name = strerrorname_np(err);
		snprintf(c->first_error, sizeof(c->first_error), "%s: %s",
			 name ? name : "?", strerror(err));
	}
}

/* One request and its whole response on connected socket fd; 0 after counting an error. */
static int exchange(struct client *c, int fd)
{
	char buf[MSG_SIZE];
	size_t got = 0;
	if (send(fd, REQUEST, MSG_SIZE, MSG_NOSIGNAL) != MSG_SIZE) {
		note_error(c, errno);
		return 0;
	}
	while (got < MSG_SIZE) {
		ssize_t n = recv(fd, buf + got, MSG_SIZE - got, 0);
		if (n <= 0) {
			note_error(c, n == 0 ? ECONNRESET : errno);
			return 0;
		}
		got += (size_t)n;
	}
	return 1;
}

/* A TCP socket with the client's timeouts, and the address of its next target service
 * (the fixed index, or a uniformly random one). */
static int client_socket(struct client *c, struct sockaddr_storage *to, socklen_t *to_len)
{
	const struct opts *o = c->o;
	uint32_t i = o->random_n > 0
		? (uint32_t)(((next_random(&c->rng) >> 32) * (uint64_t)o->random_n) >> 32)
		: (uint32_t)o->index;
	struct timeval tv = { o->timeout_ms / 1000, (o->timeout_ms % 1000) * 1000 };
	*to_len = service_address(o, i, to);
	int fd = socket(o->family, SOCK_STREAM, 0);
	if (fd < 0)
		die("socket");
	if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
	    (o->request && setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0))
		die("setsockopt timeout");
	return fd;
}

/* RST on close: no TIME_WAIT, so a long run never runs out of local ports. */
static void close_rst(int fd)
{
	struct linger rst = { 1, 0 };
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &rst, sizeof(rst));
	close(fd);
}

/* One connection: returns the connect() time in ns, or 0 after counting an error. */
static uint64_t one_connection(struct client *c)
{
	const struct opts *o = c->o;
	struct sockaddr_storage to;
	socklen_t to_len;
	uint64_t took = 0;
	int fd = client_socket(c, &to, &to_len);
	uint64_t start = now_ns();
	int rc = connect(fd, (struct sockaddr *)&to, to_len);
	uint64_t end = now_ns();
	if (rc != 0) {
		note_error(c, errno);
		goto out;
	}
	took = end > start ? end - start : 1; /* a sample is never 0: 0 means "failed" */
	if (o->request && !exchange(c, fd))
		took = 0;
out:
	close_rst(fd);
	return took;
}

static void print_error(const struct client *c)
{
	/* strerror texts hold no quotes or backslashes: no JSON escaping needed. */
	printf("\"errors\":%ld,\"first_error\":", c->errors);
	printf(c->errors ? "\"%s\"}\n" : "null}\n", c->first_error);
}

static int run_latency(const struct opts *o)
{
	struct client c = { .o = o, .rng = o->seed };
	uint64_t *samples = malloc(sizeof(*samples) * (size_t)o->connects);
	long n = 0;
	if (!samples)
		die("malloc");
	pin(o->cpu);
	for (int k = 0; k < o->connects; k++) {
		uint64_t took = one_connection(&c);
		if (took)
			samples[n++] = took;
	}
	printf("{\"samples_ns\":[");
	for (long k = 0; k < n; k++)
		printf(k ? ",%llu" : "%llu", (unsigned long long)samples[k]);
	printf("],");
	print_error(&c);
	free(samples);
	return 0;
}

static int run_rate(const struct opts *o)
{
	struct client c = { .o = o, .rng = o->seed };
	long connections = 0;
	pin(o->cpu);
	uint64_t start = now_ns(), deadline = start + (uint64_t)(o->seconds * 1e9), now = start;
	/* The clock is read every iteration: a vDSO call is ~20 ns against tens of us per
	 * connection, so batching the check would buy nothing measurable. */
	while (now < deadline) {
		if (one_connection(&c))
			connections++;
		now = now_ns();
	}
	printf("{\"connections\":%ld,\"seconds\":%.6f,", connections, (double)(now - start) / 1e9);
	print_error(&c);
	return 0;
}

struct flow {
	struct client c;
	long transactions;
	uint64_t deadline;
};

/* One rr flow: requests on one connection (re-made after a failure), or a new connection
 * for each with --new-connection, until the deadline. */
static void *rr_flow(void *arg)
{
	struct flow *f = arg;
	const struct opts *o = f->c.o;
	pin(o->cpu);
	while (now_ns() < f->deadline) {
		if (o->new_connection) {
			if (one_connection(&f->c))
				f->transactions++;
			continue;
		}
		struct sockaddr_storage to;
		socklen_t to_len;
		int fd = client_socket(&f->c, &to, &to_len); /* run_rr set o->request */
		if (connect(fd, (struct sockaddr *)&to, to_len) != 0)
			note_error(&f->c, errno);
		else
			while (now_ns() < f->deadline && exchange(&f->c, fd))
				f->transactions++;
		close_rst(fd);
	}
	return NULL;
}

static int run_rr(struct opts *o)
{
	struct flow *flows = calloc((size_t)o->flows, sizeof(*flows));
	pthread_t *tids = calloc((size_t)o->flows, sizeof(*tids));
	struct client all = { .o = o };
	long transactions = 0;
	if (!flows || !tids)
		die("calloc");
	o->request = 1; /* --new-connection's connections each carry one exchange */
	uint64_t start = now_ns(), deadline = start + (uint64_t)(o->seconds * 1e9);
	for (int k = 0; k < o->flows; k++) {
		flows[k] = (struct flow){ .c = { .o = o, .rng = o->seed + (uint64_t)k },
					  .deadline = deadline };
		if ((errno = pthread_create(&tids[k], NULL, rr_flow, &flows[k])) != 0)
			die("pthread_create");
	}
	for (int k = 0; k < o->flows; k++) {
		pthread_join(tids[k], NULL);
		transactions += flows[k].transactions;
		if (flows[k].c.errors && !all.errors)
			memcpy(all.first_error, flows[k].c.first_error, sizeof(all.first_error));
		all.errors += flows[k].c.errors;
	}
	printf("{\"transactions\":%ld,\"seconds\":%.6f,\"flows\":%d,", transactions,
	       (double)(now_ns() - start) / 1e9, o->flows);
	print_error(&all);
	free(flows);
	free(tids);
	return 0;
}

/* ---- server ----------------------------------------------------------------------- */

/* Distinct local addresses accepted on (the test checks that --random spreads): a
 * lock-free open-addressing set shared by the threads; 0 marks an empty slot. An IPv6
 * address counts by its last 32 bits: the bench's addresses differ only there. */
enum { SET_SLOTS = 1 << 16, SET_MAX = SET_SLOTS / 2 };
static _Atomic uint32_t addr_set[SET_SLOTS];
static atomic_long distinct, accepted, requests;

static void remember(uint32_t addr)
{
	if (addr == 0 || atomic_load_explicit(&distinct, memory_order_relaxed) >= SET_MAX)
		return; /* beyond SET_MAX the count is a lower bound, and probing stays short */
	for (uint32_t h = (addr * 2654435761u) >> 16;; h = (h + 1) & (SET_SLOTS - 1)) {
		uint32_t seen = atomic_load_explicit(&addr_set[h], memory_order_relaxed);
		if (seen == addr)
			return;
		if (seen == 0) {
			if (atomic_compare_exchange_strong(&addr_set[h], &seen, addr)) {
				atomic_fetch_add(&distinct, 1);
				return;
			}
			if (seen == addr)
				return; /* another thread inserted the same address */
		}
	}
}

struct server { int listener, cpu; };

static void *serve_loop(void *arg)
{
	const struct server *s = arg;
	char buf[512];
	pin(s->cpu);
	for (;;) {
		struct sockaddr_storage local;
		socklen_t len = sizeof(local);
		int fd = accept(s->listener, NULL, NULL);
		if (fd < 0) {
			if (errno == EAGAIN || errno == ECONNABORTED || errno == EINTR)
				continue; /* SO_RCVTIMEO on the listener, or a client already gone */
			die("accept");
		}
		atomic_fetch_add_explicit(&accepted, 1, memory_order_relaxed);
		if (getsockname(fd, (struct sockaddr *)&local, &len) == 0) {
			uint32_t key;
			if (local.ss_family == AF_INET6)
				memcpy(&key, ((struct sockaddr_in6 *)&local)->sin6_addr.s6_addr + 12, 4);
			else
				key = ((struct sockaddr_in *)&local)->sin_addr.s_addr;
			remember(ntohl(key));
		}
		/* A latency/rate client RSTs without sending: read fails (or returns 0) at once.
		 * A silent client costs at most the inherited 1 s SO_RCVTIMEO, never a wedge.
		 * An rr client sends request after request: each MSG_SIZE read is answered. */
		ssize_t n;
		size_t pending = 0;
		int talking = 0;
		while ((n = read(fd, buf, sizeof(buf))) > 0) {
			/* A client that sent a request may pause longer than 1 s between two (32
			 * rr threads on one loaded core): only a silent one is cut at 1 s. */
			if (!talking++)
				setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &(struct timeval){ 30, 0 },
					   sizeof(struct timeval));
			pending += (size_t)n;
			for (; pending >= MSG_SIZE; pending -= MSG_SIZE) {
				atomic_fetch_add_explicit(&requests, 1, memory_order_relaxed);
				/* A failed send: the client gave up (reset), its error, not ours. */
				if (send(fd, RESPONSE, MSG_SIZE, MSG_NOSIGNAL) != MSG_SIZE)
					break;
			}
		}
		close(fd);
	}
	return NULL;
}

static int run_serve(const struct opts *o)
{
	struct sockaddr_in any = { .sin_family = AF_INET, .sin_port = htons((uint16_t)o->port),
				   .sin_addr.s_addr = htonl(INADDR_ANY) };
	struct sockaddr_in6 any6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)o->port),
				     .sin6_addr = IN6ADDR_ANY_INIT };
	/* Accepted sockets inherit the listener's SO_RCVTIMEO (the socket is cloned). */
	struct timeval tv = { 1, 0 };
	int one = 1;
	struct server s = { .cpu = o->cpu };
	sigset_t stop;

	s.listener = socket(o->family, SOCK_STREAM, 0);
	if (s.listener < 0)
		die("socket");
	if (setsockopt(s.listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    setsockopt(s.listener, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
	    (o->family == AF_INET6 &&
	     setsockopt(s.listener, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0))
		die("setsockopt");
	if (o->family == AF_INET6 ? bind(s.listener, (struct sockaddr *)&any6, sizeof(any6))
				  : bind(s.listener, (struct sockaddr *)&any, sizeof(any)))
		die("bind");
	if (listen(s.listener, 4096) != 0)
		die("listen");

	/* Workers never see SIGTERM/SIGINT (the mask is inherited): the main thread waits
	 * for them or for --lifetime, prints the counters and exits, ending the workers. */
	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop, NULL);
	for (int t = 0; t < o->threads; t++) {
		pthread_t tid;
		if ((errno = pthread_create(&tid, NULL, serve_loop, &s)) != 0)
			die("pthread_create");
	}
	printf("ready\n");
	fflush(stdout);

	struct timespec life = { (time_t)o->lifetime,
				 (long)((o->lifetime - (double)(time_t)o->lifetime) * 1e9) };
	while (sigtimedwait(&stop, NULL, &life) < 0 && errno == EINTR) {
	}
	printf("{\"accepted\":%ld,\"requests\":%ld,\"local_addresses\":%ld}\n",
	       atomic_load(&accepted), atomic_load(&requests), atomic_load(&distinct));
	fflush(stdout);
	_exit(0); /* the workers are blocked in accept/read: don't wait for them */
}

/* ---- command line ----------------------------------------------------------------- */

static double number(const char *flag, const char *text, double min, double max)
{
	char *end;
	errno = 0;
	double v = strtod(text, &end);
	if (errno || *end || end == text || !(v >= min && v <= max)) {
		fprintf(stderr, "connbench: %s: expected a number in [%g, %g], got %s\n",
			flag, min, max, text);
		exit(2);
	}
	return v;
}

static int integer(const char *flag, const char *text, int min, int max)
{
	double v = number(flag, text, min, max);
	if (v != (double)(int)v) {
		fprintf(stderr, "connbench: %s: expected an integer, got %s\n", flag, text);
		exit(2);
	}
	return (int)v;
}

int main(int argc, char **argv)
{
	struct opts o = { .family = AF_INET, .port = -1, .cpu = -1, .index = -1, .connects = -1,
			  .seconds = -1, .timeout_ms = 1000, .threads = 1, .lifetime = 600,
			  .seed = 1 };
	int have_base = 0;
	if (argc < 2)
		usage("missing subcommand");
	const char *cmd = argv[1];
	for (int k = 2; k < argc; k++) {
		const char *f = argv[k];
		if (!strcmp(f, "--request")) {
			o.request = 1;
			continue;
		}
		if (!strcmp(f, "--ipv6")) {
			o.listen6 = 1;
			continue;
		}
		if (!strcmp(f, "--new-connection")) {
			o.new_connection = 1;
			continue;
		}
		if (k + 1 >= argc)
			usage("option without a value");
		const char *v = argv[++k];
		if (!strcmp(f, "--base")) {
			if (inet_pton(AF_INET, v, o.base) == 1)
				o.family = AF_INET;
			else if (inet_pton(AF_INET6, v, o.base) == 1)
				o.family = AF_INET6;
			else
				usage("--base: not an IPv4 or IPv6 address");
			have_base = 1;
		} else if (!strcmp(f, "--port")) {
			o.port = integer(f, v, 1, 65535);
		} else if (!strcmp(f, "--index")) {
			o.index = integer(f, v, 0, 1 << 30);
		} else if (!strcmp(f, "--random")) {
			o.random_n = integer(f, v, 1, 1 << 30);
		} else if (!strcmp(f, "--connects")) {
			o.connects = integer(f, v, 1, 100000000);
		} else if (!strcmp(f, "--seconds")) {
			o.seconds = number(f, v, 0.001, 86400);
		} else if (!strcmp(f, "--lifetime")) {
			o.lifetime = number(f, v, 0.001, 86400);
		} else if (!strcmp(f, "--cpu")) {
			o.cpu = integer(f, v, 0, CPU_SETSIZE - 1);
		} else if (!strcmp(f, "--seed")) {
			o.seed = (uint64_t)number(f, v, 0, 1e15);
		} else if (!strcmp(f, "--timeout-ms")) {
			o.timeout_ms = integer(f, v, 1, 600000);
		} else if (!strcmp(f, "--threads")) {
			o.threads = integer(f, v, 1, 256);
		} else if (!strcmp(f, "--flows")) {
			o.flows = integer(f, v, 1, 256);
		} else {
			usage("unknown option");
		}
	}
	if (o.port < 0)
		usage("--port is required");
	if (!strcmp(cmd, "serve")) {
		o.family = o.listen6 ? AF_INET6 : AF_INET;
		return run_serve(&o);
	}
	if (!have_base || (o.index >= 0) == (o.random_n > 0))
		usage("clients need --base and exactly one of --index, --random");
	uint8_t last[16];
	memcpy(last, o.base, sizeof(last));
	if (add_index(last, o.family == AF_INET ? 4 : 16,
		      (uint64_t)(o.index >= 0 ? o.index : o.random_n - 1) + 1))
		usage("--base plus the index leaves the address family");
	if (!strcmp(cmd, "latency") && o.connects > 0)
		return run_latency(&o);
	if (!strcmp(cmd, "rate") && o.seconds > 0)
		return run_rate(&o);
	if (!strcmp(cmd, "rr") && o.seconds > 0 && o.flows > 0)
		return run_rr(&o);
	usage("latency needs --connects, rate --seconds, rr --seconds and --flows; or unknown"
	      " subcommand");
}
