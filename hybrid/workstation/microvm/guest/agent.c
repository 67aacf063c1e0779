/*
 * hybrid's guest agent: /init of the microVM's initramfs, then PID 1 serving the host.
 *
 * As init it loads the kernel modules, mounts the read-only root under an overlay and switches
 * to it, with system calls rather than a shell: under emulation every exec costs tens of
 * milliseconds, and a Python agent cost more than a second to start.
 *
 * As the agent it serves JSON lines over the virtio-serial port "hybrid.agent", one request per
 * line (ops: ping, setup, exec, kill, kill_all, sync). Every command runs as an unprivileged
 * user with no capabilities and no_new_privs, in its own cgroup under /sys/fs/cgroup/jobs
 * (whose memory and pids limits are the workstation's), so a deadline kills the whole process
 * tree at once (cgroup.kill) and an OOM kill is counted. Output beyond the cap is read and
 * dropped. One thread, one poll loop: the port, a signalfd for children, every job's pipes.
 *
 * Static, libc only: built by hybrid.workstation.microvm.build with `cc -static`.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PORT_NAME "hybrid.agent"
#define JOBS "/sys/fs/cgroup/jobs"
#define MAX_JOBS 128
#define OUT_CAP (4 << 20) /* queued bytes for the host beyond which job pipes are not read */
#define CHUNK 65536
#define THRASH_WINDOW 2.0 /* seconds over which a job stalled on memory half the time is OOM */
#define SAMPLE_EVERY 0.25
#define GRACE 10.0 /* seconds a killed job gets to exit and close its pipes */

extern char **environ;

/* ---- small helpers ------------------------------------------------------------------------ */

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* A small file (sysfs, cgroupfs) into ``buf``, NUL-terminated; its length, or -1. */
static ssize_t read_text(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    return n;
}

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}

static void die(const char *what) {
    say("init: %s: %s", what, strerror(errno));
    sync();
    reboot(RB_POWER_OFF);
    _exit(1);
}

static int mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n >= sizeof buf) return errno = ENAMETOOLONG, -1;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

/* ---- JSON in ------------------------------------------------------------------------------ */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct jv {
    int type;
    double num;
    char *str; /* J_STR: NUL-terminated; slen excludes it */
    size_t slen;
    int count;
    char **keys; /* J_OBJ */
    struct jv *items;
} jv;

typedef struct {
    const char *p, *end;
} jp;

static void skip(jp *q) {
    while (q->p < q->end && (*q->p == ' ' || *q->p == '\t' || *q->p == '\r' || *q->p == '\n')) q->p++;
}

static int hex4(jp *q, unsigned *out) {
    if (q->end - q->p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *q->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

static int parse_string(jp *q, char **out, size_t *len) {
    q->p++; /* opening quote */
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    while (q->p < q->end && *q->p != '"') {
        if (cap - n < 8) s = realloc(s, cap *= 2);
        char c = *q->p++;
        if (c != '\\') {
            s[n++] = c;
            continue;
        }
        if (q->p >= q->end) break;
        c = *q->p++;
        unsigned u;
        switch (c) {
        case 'n': s[n++] = '\n'; break;
        case 't': s[n++] = '\t'; break;
        case 'r': s[n++] = '\r'; break;
        case 'b': s[n++] = '\b'; break;
        case 'f': s[n++] = '\f'; break;
        case 'u':
            if (hex4(q, &u) < 0) goto bad;
            if (u >= 0xd800 && u < 0xdc00 && q->end - q->p >= 6 && q->p[0] == '\\' && q->p[1] == 'u') {
                unsigned lo;
                q->p += 2;
                if (hex4(q, &lo) < 0 || lo < 0xdc00 || lo >= 0xe000) goto bad;
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (u < 0x80) s[n++] = u;
            else if (u < 0x800) s[n++] = 0xc0 | u >> 6, s[n++] = 0x80 | (u & 0x3f);
            else if (u < 0x10000)
                s[n++] = 0xe0 | u >> 12, s[n++] = 0x80 | (u >> 6 & 0x3f), s[n++] = 0x80 | (u & 0x3f);
            else
                s[n++] = 0xf0 | u >> 18, s[n++] = 0x80 | (u >> 12 & 0x3f),
                s[n++] = 0x80 | (u >> 6 & 0x3f), s[n++] = 0x80 | (u & 0x3f);
            break;
        default: s[n++] = c; /* \" \\ \/ */
        }
    }
    if (q->p >= q->end) goto bad;
    q->p++;
    s[n] = 0;
    *out = s;
    *len = n;
    return 0;
bad:
    free(s);
    return -1;
}

static void jfree(jv *v) {
    if (v->type == J_STR) free(v->str);
    for (int i = 0; i < v->count; i++) {
        jfree(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static int parse_value(jp *q, jv *v, int depth) {
    memset(v, 0, sizeof *v);
    skip(q);
    if (q->p >= q->end || depth > 32) return -1;
    char c = *q->p;
    if (c == '"') {
        v->type = J_STR;
        return parse_string(q, &v->str, &v->slen);
    }
    if (c == '{' || c == '[') {
        int object = c == '{';
        char close = object ? '}' : ']';
        v->type = object ? J_OBJ : J_ARR;
        q->p++;
        skip(q);
        if (q->p < q->end && *q->p == close) return q->p++, 0;
        int cap = 0;
        for (;;) {
            if (v->count == cap) {
                cap = cap ? cap * 2 : 8;
                v->items = realloc(v->items, cap * sizeof *v->items);
                if (object) v->keys = realloc(v->keys, cap * sizeof *v->keys);
            }
            if (object) {
                size_t kl;
                skip(q);
                if (q->p >= q->end || *q->p != '"' || parse_string(q, &v->keys[v->count], &kl) < 0) return -1;
                skip(q);
                if (q->p >= q->end || *q->p != ':') {
                    free(v->keys[v->count]);
                    return -1;
                }
                q->p++;
            }
            if (parse_value(q, &v->items[v->count], depth + 1) < 0) {
                jfree(&v->items[v->count]);
                if (object) free(v->keys[v->count]);
                return -1;
            }
            v->count++;
            skip(q);
            if (q->p < q->end && *q->p == ',') {
                q->p++;
                continue;
            }
            if (q->p < q->end && *q->p == close) return q->p++, 0;
            return -1;
        }
    }
    if (q->end - q->p >= 4 && !memcmp(q->p, "true", 4)) return v->type = J_BOOL, v->num = 1, q->p += 4, 0;
    if (q->end - q->p >= 5 && !memcmp(q->p, "false", 5)) return v->type = J_BOOL, q->p += 5, 0;
    if (q->end - q->p >= 4 && !memcmp(q->p, "null", 4)) return v->type = J_NULL, q->p += 4, 0;
    char buf[64];
    size_t n = 0;
    while (q->p < q->end && n < sizeof buf - 1 && strchr("+-0123456789.eE", *q->p)) buf[n++] = *q->p++;
    if (!n) return -1;
    buf[n] = 0;
    char *stop;
    v->type = J_NUM;
    v->num = strtod(buf, &stop);
    return *stop ? -1 : 0;
}

static jv *jget(jv *obj, const char *key) {
    if (!obj || obj->type != J_OBJ) return NULL;
    for (int i = 0; i < obj->count; i++)
        if (!strcmp(obj->keys[i], key)) return &obj->items[i];
    return NULL;
}

static double jnum(jv *obj, const char *key, double fallback) {
    jv *v = jget(obj, key);
    return v && v->type == J_NUM ? v->num : fallback;
}

static const char *jstr(jv *obj, const char *key) {
    jv *v = jget(obj, key);
    return v && v->type == J_STR ? v->str : NULL;
}

/* ---- JSON out: everything for the host is queued here and written when the port takes it --- */

static char *out;
static size_t out_len, out_off, out_cap;

static void put(const void *data, size_t n) {
    if (out_len + n > out_cap) {
        while (out_len + n > out_cap) out_cap = out_cap ? out_cap * 2 : 65536;
        out = realloc(out, out_cap);
    }
    memcpy(out + out_len, data, n);
    out_len += n;
}

static void putf(const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    put(buf, n < (int)sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void put_string(const char *s) {
    put("\"", 1);
    for (; *s; s++) {
        unsigned char c = *s;
        if (c == '"' || c == '\\') putf("\\%c", c);
        else if (c < 0x20) putf("\\u%04x", c);
        else put(s, 1);
    }
    put("\"", 1);
}

static void put_base64(const unsigned char *data, size_t n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char quad[4];
    put("\"", 1);
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = data[i] << 16 | (i + 1 < n ? data[i + 1] << 8 : 0) | (i + 2 < n ? data[i + 2] : 0);
        quad[0] = digits[v >> 18 & 63];
        quad[1] = digits[v >> 12 & 63];
        quad[2] = i + 1 < n ? digits[v >> 6 & 63] : '=';
        quad[3] = i + 2 < n ? digits[v & 63] : '=';
        put(quad, 4);
    }
    put("\"", 1);
}

static void put_id(jv *req) {
    jv *id = jget(req, "id");
    if (id && id->type == J_NUM) putf("\"id\":%.0f", id->num);
    else put("\"id\":null", 9);
}

static void reply_error(jv *req, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    put("{\"error\":", 9);
    put_string(buf);
    put(",", 1);
    put_id(req);
    put("}\n", 2);
}

/* The end of an exec that never started. */
static void end_with_error(jv *req, const char *message) {
    put("{", 1);
    put_id(req);
    put(",\"end\":true,\"error\":", 20);
    put_string(message);
    put("}\n", 2);
}

/* ---- jobs --------------------------------------------------------------------------------- */

typedef struct {
    int used;
    double id;
    pid_t pid;
    char cgroup[64];
    double start, until, give_up, next_sample;
    size_t limit, kept[2];
    int fd[2], cut[2];
    int exited, status, timed_out, thrashed;
    double sample_t[16], sample_v[16];
    int samples;
} job;

static job jobs[MAX_JOBS];
static unsigned long counter;

static void kill_cgroup(const char *cgroup) {
    char path[400];
    snprintf(path, sizeof path, "%s/cgroup.kill", cgroup);
    write_file(path, "1");
}

static void set_clock(jv *req) {
    jv *t = jget(req, "time");
    if (!t || t->type != J_NUM) return;
    /* A VM restored from a snapshot wakes with the snapshot's time: the host's wins. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (fabs(now.tv_sec + now.tv_nsec / 1e9 - t->num) > 0.5) {
        now.tv_sec = (time_t)t->num;
        now.tv_nsec = (long)((t->num - now.tv_sec) * 1e9);
        clock_settime(CLOCK_REALTIME, &now);
    }
}

static void child_fail(int code, const char *what) {
    char buf[600];
    int n = snprintf(buf, sizeof buf, "%s: %s\n", what, strerror(errno));
    if (write(2, buf, n) < 0) _exit(code);
    _exit(code);
}

/* In the forked child: join the job's cgroup, drop every privilege, exec. Never returns. */
static void child(const char *cgroup, int out_fd, int err_fd, const char *cwd, uid_t uid, char **argv,
                  char **envp) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, 0);
    char path[320];
    snprintf(path, sizeof path, "%s/cgroup.procs", cgroup);
    if (write_file(path, "0") < 0) child_fail(127, "joining the job's cgroup");
    write_file("/proc/self/oom_score_adj", "0"); /* the agent's -1000 is inherited otherwise */
    if (chdir(cwd) < 0) child_fail(127, cwd);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(126, "no_new_privs");
    for (int cap = 0; prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0; cap++) {
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
        child_fail(126, "dropping to the job's user");
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    if (syscall(SYS_capset, &header, data) < 0) child_fail(126, "clearing capabilities");
    environ = envp;
    execvp(argv[0], argv);
    child_fail(errno == ENOENT ? 127 : 126, argv[0]);
}

static void start_job(jv *req) {
    jv *argv_v = jget(req, "argv"), *env_v = jget(req, "env");
    const char *cwd = jstr(req, "cwd");
    job *j = NULL;
    for (int i = 0; i < MAX_JOBS; i++)
        if (!jobs[i].used) {
            j = &jobs[i];
            break;
        }
    const char *bad = NULL;
    if (!argv_v || argv_v->type != J_ARR || argv_v->count == 0) bad = "exec needs a non-empty argv";
    else if (!cwd) bad = "exec needs a cwd";
    else if (!j) bad = "too many commands at once";
    for (int i = 0; !bad && i < argv_v->count; i++)
        if (argv_v->items[i].type != J_STR || strlen(argv_v->items[i].str) != argv_v->items[i].slen)
            bad = "argv holds a value that is not a string without NUL";
    for (int i = 0; !bad && env_v && i < env_v->count; i++)
        if (env_v->items[i].type != J_STR || strlen(env_v->items[i].str) != env_v->items[i].slen)
            bad = "env holds a value that is not a string without NUL";
    set_clock(req);
    char cgroup[64];
    snprintf(cgroup, sizeof cgroup, JOBS "/%lu", ++counter);
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (!bad && mkdir(cgroup, 0755) < 0) bad = "making the job's cgroup";
    if (!bad && (pipe2(out_pipe, O_CLOEXEC) < 0 || pipe2(err_pipe, O_CLOEXEC) < 0)) bad = "pipe";
    if (bad) {
        end_with_error(req, bad);
        for (int i = 0; i < 2; i++) {
            if (out_pipe[i] >= 0) close(out_pipe[i]);
            if (err_pipe[i] >= 0) close(err_pipe[i]);
        }
        rmdir(cgroup);
        return;
    }
    char **argv = calloc(argv_v->count + 1, sizeof *argv);
    for (int i = 0; i < argv_v->count; i++) argv[i] = argv_v->items[i].str;
    int envs = env_v && env_v->type == J_OBJ ? env_v->count : 0;
    char **envp = calloc(envs + 1, sizeof *envp);
    for (int i = 0; i < envs; i++)
        if (asprintf(&envp[i], "%s=%s", env_v->keys[i], env_v->items[i].str) < 0) envp[i] = NULL;
    uid_t uid = (uid_t)jnum(req, "uid", 65534);
    double now = mono();
    pid_t pid = fork();
    int fork_errno = errno;
    if (pid == 0) child(cgroup, out_pipe[1], err_pipe[1], cwd, uid, argv, envp);
    for (int i = 0; i < envs; i++) free(envp[i]);
    free(envp);
    free(argv);
    close(out_pipe[1]);
    close(err_pipe[1]);
    if (pid < 0) {
        close(out_pipe[0]);
        close(err_pipe[0]);
        rmdir(cgroup);
        end_with_error(req, strerror(fork_errno));
        return;
    }
    memset(j, 0, sizeof *j);
    j->used = 1;
    j->id = jnum(req, "id", -1);
    j->pid = pid;
    memcpy(j->cgroup, cgroup, sizeof cgroup);
    j->start = now;
    j->until = now + jnum(req, "timeout", 60);
    j->next_sample = now + SAMPLE_EVERY;
    j->limit = (size_t)jnum(req, "limit", 1 << 20);
    j->fd[0] = out_pipe[0];
    j->fd[1] = err_pipe[0];
    fcntl(j->fd[0], F_SETFL, O_NONBLOCK);
    fcntl(j->fd[1], F_SETFL, O_NONBLOCK);
}

static const char *const STREAMS[2] = {"stdout", "stderr"};

static void close_stream(job *j, int k) {
    close(j->fd[k]);
    j->fd[k] = -1;
}

static void pump(job *j, int k) {
    static unsigned char buf[CHUNK];
    ssize_t n = read(j->fd[k], buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
        close_stream(j, k);
        return;
    }
    size_t room = j->limit > j->kept[k] ? j->limit - j->kept[k] : 0;
    if ((size_t)n > room) {
        j->cut[k] = 1;
        n = room;
    }
    if (!n) return;
    j->kept[k] += n;
    putf("{\"id\":%.0f,\"stream\":\"%s\",\"data\":", j->id, STREAMS[k]);
    put_base64(buf, n);
    put("}\n", 2);
}

/* At its memory limit a job without swap can spend minutes reclaiming its own program's pages
 * before the kernel's OOM killer acts (far longer under emulation), so a job that stalls on
 * memory most of the time (PSI "full") is ended here as out of memory, as systemd-oomd does. */
static void sample(job *j, double now) {
    j->next_sample = now + SAMPLE_EVERY;
    char path[320], text[512];
    snprintf(path, sizeof path, "%s/memory.pressure", j->cgroup);
    if (read_text(path, text, sizeof text) <= 0) return;
    char *full = strstr(text, "full");
    char *total = full ? strstr(full, "total=") : NULL;
    if (!total) return;
    double stalled = strtod(total + 6, NULL) / 1e6;
    if (j->samples == 16) {
        memmove(j->sample_t, j->sample_t + 1, 15 * sizeof(double));
        memmove(j->sample_v, j->sample_v + 1, 15 * sizeof(double));
        j->samples--;
    }
    j->sample_t[j->samples] = now;
    j->sample_v[j->samples++] = stalled;
    while (j->samples > 1 && j->sample_t[0] < now - THRASH_WINDOW) {
        memmove(j->sample_t, j->sample_t + 1, (j->samples - 1) * sizeof(double));
        memmove(j->sample_v, j->sample_v + 1, (j->samples - 1) * sizeof(double));
        j->samples--;
    }
    double span = now - j->sample_t[0];
    if (span >= THRASH_WINDOW * 0.75 && stalled - j->sample_v[0] > span / 2) {
        j->thrashed = 1;
        j->give_up = now + GRACE;
        kill_cgroup(j->cgroup);
    }
}

static void finish(job *j, double now) {
    for (int k = 0; k < 2; k++)
        if (j->fd[k] >= 0) close_stream(j, k);
    int oom = j->thrashed;
    char path[320], text[512];
    snprintf(path, sizeof path, "%s/memory.events", j->cgroup);
    char *line = read_text(path, text, sizeof text) > 0 ? strstr(text, "oom_kill ") : NULL;
    if (line && strtol(line + 9, NULL, 10) != 0) oom = 1;
    rmdir(j->cgroup); /* background processes it left keep it (kill_all ends them) */
    putf("{\"id\":%.0f,\"end\":true,\"code\":", j->id);
    if (j->exited && WIFEXITED(j->status)) putf("%d,\"signal\":null", WEXITSTATUS(j->status));
    else if (j->exited && WIFSIGNALED(j->status)) putf("null,\"signal\":%d", WTERMSIG(j->status));
    else put("null,\"signal\":null", 18);
    putf(",\"timed_out\":%s,\"oom\":%s,\"cut\":[", j->timed_out ? "true" : "false", oom ? "true" : "false");
    if (j->cut[0]) put("\"stdout\"", 8);
    if (j->cut[0] && j->cut[1]) put(",", 1);
    if (j->cut[1]) put("\"stderr\"", 8);
    putf("],\"wall_ms\":%.3f}\n", (now - j->start) * 1000);
    j->used = 0;
}

/* Deadlines, memory pressure and completion; the seconds until this job next needs a look. */
static double tend(job *j, double now) {
    if (!j->exited && now >= j->next_sample && !j->thrashed) sample(j, now);
    if (now >= j->until && !j->give_up) {
        j->timed_out = 1;
        j->give_up = now + GRACE;
        kill_cgroup(j->cgroup);
    }
    int open_pipes = j->fd[0] >= 0 || j->fd[1] >= 0;
    if ((j->exited && !open_pipes) || (j->give_up && now >= j->give_up)) {
        finish(j, now);
        return INFINITY;
    }
    double next = j->give_up ? j->give_up : j->until;
    if (!j->exited && !j->thrashed && j->next_sample < next) next = j->next_sample;
    return next - now;
}

static void reap(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        for (int i = 0; i < MAX_JOBS; i++)
            if (jobs[i].used && jobs[i].pid == pid && !jobs[i].exited) {
                jobs[i].exited = 1;
                jobs[i].status = status;
            }
}

static void kill_all(void) {
    DIR *dir = opendir(JOBS);
    if (!dir) return;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        if (entry->d_type != DT_DIR || entry->d_name[0] == '.') continue;
        char path[320];
        snprintf(path, sizeof path, JOBS "/%s", entry->d_name);
        kill_cgroup(path);
        for (int i = 0; i < 100 && rmdir(path) < 0; i++) {
            reap();
            usleep(10000);
        }
    }
    closedir(dir);
}

/* ---- requests ----------------------------------------------------------------------------- */

static int setup(jv *req) {
    set_clock(req);
    char text[32];
    snprintf(text, sizeof text, "%.0f", jnum(req, "memory", 512 << 20));
    if (write_file(JOBS "/memory.max", text) < 0) return reply_error(req, "memory.max: %s", strerror(errno)), -1;
    snprintf(text, sizeof text, "%.0f", jnum(req, "pids", 256));
    if (write_file(JOBS "/pids.max", text) < 0) return reply_error(req, "pids.max: %s", strerror(errno)), -1;
    jv *shares = jget(req, "shares");
    for (int i = 0; shares && shares->type == J_ARR && i < shares->count; i++) {
        jv *share = &shares->items[i];
        const char *tag = jstr(share, "tag"), *path = jstr(share, "path");
        jv *ro = jget(share, "ro");
        if (!tag || !path) return reply_error(req, "a share needs a tag and a path"), -1;
        unsigned long flags = MS_NOSUID | MS_NODEV | (ro && ro->num ? MS_RDONLY : 0);
        if (mkdirs(path) < 0 ||
            mount(tag, path, "9p", flags, "trans=virtio,version=9p2000.L,msize=262144,cache=mmap") < 0)
            return reply_error(req, "mount %s: %s", path, strerror(errno)), -1;
    }
    /* The root was an overlay only so the mount points could be made: from now on it is read-only. */
    if (mount("root", "/", "overlay", MS_REMOUNT | MS_RDONLY, NULL) < 0)
        return reply_error(req, "remounting / read-only: %s", strerror(errno)), -1;
    const char *cwd = jstr(req, "cwd");
    if (chdir(cwd ? cwd : "/") < 0) return reply_error(req, "%s: %s", cwd, strerror(errno)), -1;
    putf("{\"uid\":%.0f,", jnum(req, "uid", 65534));
    put_id(req);
    put("}\n", 2);
    return 0;
}

static void handle(jv *req) {
    const char *op = jstr(req, "op");
    if (!op) op = "";
    if (!strcmp(op, "exec")) {
        start_job(req);
        return;
    }
    if (!strcmp(op, "setup")) {
        setup(req);
        return;
    }
    if (!strcmp(op, "ping")) {
        put("{\"pong\":true,", 13);
    } else if (!strcmp(op, "kill")) {
        double target = jnum(req, "target", -1);
        for (int i = 0; i < MAX_JOBS; i++)
            if (jobs[i].used && jobs[i].id == target) kill_cgroup(jobs[i].cgroup);
        put("{", 1);
    } else if (!strcmp(op, "kill_all")) {
        kill_all();
        put("{", 1);
    } else if (!strcmp(op, "sync")) {
        sync();
        put("{", 1);
    } else {
        reply_error(req, "unknown op '%s'", op);
        return;
    }
    put_id(req);
    put("}\n", 2);
}

/* ---- init --------------------------------------------------------------------------------- */

static void must_mount(const char *source, const char *target, const char *type, unsigned long flags,
                       const char *data) {
    if (mount(source, target, type, flags, data) < 0) {
        char what[256];
        snprintf(what, sizeof what, "mount %s", target);
        die(what);
    }
}

static void init(void) {
    mkdir("/proc", 0755);
    mkdir("/sys", 0755);
    mkdir("/dev", 0755);
    must_mount("proc", "/proc", "proc", 0, NULL);
    must_mount("sys", "/sys", "sysfs", 0, NULL);
    must_mount("dev", "/dev", "devtmpfs", 0, NULL);
    int console = open("/dev/console", O_RDWR);
    if (console >= 0) {
        dup2(console, 1);
        dup2(console, 2);
        if (console > 2) close(console);
    }
    FILE *order = fopen("/modules.order", "r");
    char name[128];
    while (order && fscanf(order, "%127s", name) == 1) {
        char path[256];
        snprintf(path, sizeof path, "/lib/modules/%s.ko", name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || syscall(SYS_finit_module, fd, "", 0) < 0) say("init: insmod %s: %s", name, strerror(errno));
        if (fd >= 0) close(fd);
        unlink(path); /* the initramfs stays in RAM: drop what is loaded */
    }
    if (order) fclose(order);
    struct stat st;
    for (int i = 0; i < 500 && stat("/dev/vda", &st) < 0; i++) usleep(10000);
    mkdir("/lower", 0755);
    mkdir("/upper", 0755);
    mkdir("/newroot", 0755);
    if (mount("/dev/vda", "/lower", "ext4", MS_RDONLY, "noload") < 0) die("no root filesystem");
    /* An overlay only so setup can make mount points for the shares; it then remounts / read-only. */
    must_mount("upper", "/upper", "tmpfs", 0, "mode=755,size=4m");
    mkdir("/upper/u", 0755);
    mkdir("/upper/w", 0755);
    must_mount("root", "/newroot", "overlay", 0, "lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w");
    must_mount("run", "/newroot/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=8m");
    must_mount("/proc", "/newroot/proc", NULL, MS_MOVE, NULL);
    must_mount("/sys", "/newroot/sys", NULL, MS_MOVE, NULL);
    must_mount("/dev", "/newroot/dev", NULL, MS_MOVE, NULL);
    must_mount("tmp", "/newroot/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=50%");
    mkdir("/newroot/dev/shm", 01777);
    must_mount("shm", "/newroot/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=25%");
    must_mount("cgroup2", "/newroot/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    if (write_file("/newroot/sys/fs/cgroup/cgroup.subtree_control", "+memory +pids") < 0) die("cgroup controllers");
    if (mkdir("/newroot" JOBS, 0755) < 0) die("mkdir " JOBS);
    if (write_file("/newroot" JOBS "/cgroup.subtree_control", "+memory +pids") < 0) die("job controllers");
    if (chdir("/newroot") < 0) die("chdir /newroot");
    must_mount(".", "/", NULL, MS_MOVE, NULL);
    if (chroot(".") < 0 || chdir("/") < 0) die("chroot");
}

static int find_port(void) {
    for (int tries = 0; tries < 500; tries++) {
        DIR *dir = opendir("/sys/class/virtio-ports");
        struct dirent *entry;
        while (dir && (entry = readdir(dir))) {
            if (entry->d_name[0] == '.') continue;
            char path[300], name[64];
            snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", entry->d_name);
            if (read_text(path, name, sizeof name) > 0 && !strncmp(name, PORT_NAME, strlen(PORT_NAME)) && (name[strlen(PORT_NAME)] == '\n' || !name[strlen(PORT_NAME)])) {
                snprintf(path, sizeof path, "/dev/%s", entry->d_name);
                closedir(dir);
                int port = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
                if (port < 0) die(path);
                return port;
            }
        }
        if (dir) closedir(dir);
        usleep(10000);
    }
    errno = ENODEV;
    die("no virtio-serial port " PORT_NAME);
    return -1;
}

/* ---- the loop ----------------------------------------------------------------------------- */

int main(void) {
    if (getpid() == 1 && access("/modules.order", F_OK) == 0) init();
    setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    write_file("/proc/self/oom_score_adj", "-1000");
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGPIPE);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    sigdelset(&mask, SIGPIPE);
    int children = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    int port = find_port();
    int connected = 0;
    char *in = NULL;
    size_t in_len = 0, in_cap = 0;
    struct pollfd fds[2 + 2 * MAX_JOBS];
    job *owner[2 + 2 * MAX_JOBS];
    int kind[2 + 2 * MAX_JOBS];
    for (;;) {
        double now = mono(), wait = INFINITY;
        for (int i = 0; i < MAX_JOBS; i++)
            if (jobs[i].used) {
                double next = tend(&jobs[i], now);
                if (next < wait) wait = next;
            }
        if (!connected) {
            /* No host on the other end (at boot, between snapshot and restore, or a client
             * gone): the port reports a hang-up until one connects, so look again shortly. */
            struct pollfd probe = {port, POLLIN, 0};
            poll(&probe, 1, 0);
            connected = !(probe.revents & POLLHUP);
            if (!connected) {
                out_len = out_off = 0; /* the replies are lost, as their host is */
                in_len = 0;
                if (wait > 0.01) wait = 0.01;
            }
        }
        int n = 0;
        fds[n] = (struct pollfd){connected ? port : -1, POLLIN | (out_len > out_off ? POLLOUT : 0), 0};
        owner[n++] = NULL;
        fds[n] = (struct pollfd){children, POLLIN, 0};
        owner[n++] = NULL;
        int room = out_len - out_off < OUT_CAP;
        for (int i = 0; room && i < MAX_JOBS; i++)
            for (int k = 0; jobs[i].used && k < 2; k++)
                if (jobs[i].fd[k] >= 0) {
                    fds[n] = (struct pollfd){jobs[i].fd[k], POLLIN, 0};
                    owner[n] = &jobs[i];
                    kind[n++] = k;
                }
        int timeout = wait == INFINITY ? -1 : (int)ceil(fmax(wait, 0) * 1000);
        if (poll(fds, n, timeout) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        if (fds[1].revents) {
            struct signalfd_siginfo info;
            while (read(children, &info, sizeof info) > 0) {
            }
            reap();
        }
        for (int i = 2; i < n; i++)
            if (fds[i].revents) pump(owner[i], kind[i]);
        if (fds[0].revents & POLLIN) {
            if (in_cap - in_len < CHUNK) in = realloc(in, in_cap = in_cap * 2 + CHUNK);
            ssize_t got = read(port, in + in_len, in_cap - in_len);
            if (got == 0) connected = 0;
            if (got > 0) {
                in_len += got;
                char *line = in, *nl;
                while ((nl = memchr(line, '\n', in + in_len - line))) {
                    jp q = {line, nl};
                    jv req;
                    skip(&q);
                    if (q.p < q.end) {
                        if (parse_value(&q, &req, 0) == 0 && req.type == J_OBJ) handle(&req);
                        jfree(&req);
                    }
                    line = nl + 1;
                }
                in_len -= line - in;
                memmove(in, line, in_len);
            }
        } else if (fds[0].revents & (POLLHUP | POLLERR)) {
            connected = 0;
        }
        if (connected && out_len > out_off) {
            ssize_t put_n = write(port, out + out_off, out_len - out_off);
            if (put_n > 0) out_off += put_n;
            else if (put_n < 0 && errno != EAGAIN && errno != EINTR) connected = 0;
            if (out_off == out_len) out_len = out_off = 0;
            else if (out_off > out_cap / 2) {
                memmove(out, out + out_off, out_len - out_off);
                out_len -= out_off;
                out_off = 0;
            }
        }
    }
}
