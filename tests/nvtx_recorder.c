/*
 * A tiny NVTX tool for the tests: what Nsight Systems is to NVTX, without a GPU.
 *
 * NVTX hands every call to the library named by NVTX_INJECTION64_PATH: at the first NVTX
 * call of a process it loads that library and calls its InitializeInjectionNvtx2, which fills
 * in the function tables. This one fills in the domain calls the `nvtx` Python package makes
 * (domains, registered strings, categories, push/pop and start/end ranges, marks) and writes
 * each call as one line to NVTX_RECORDER_DIR/nvtx-<pid>.tsv:
 *
 *   domain  <handle> <name>
 *   category <domain> <id> <name>
 *   push    <domain> <thread> <ns> <message> <category> <color>
 *   pop     <domain> <thread> <ns>
 *   start   <domain> <thread> <ns> <range id> <message> <category> <color>
 *   end     <domain> <thread> <ns> <range id>
 *   mark    <domain> <thread> <ns> <message> <category> <color>
 *
 * <thread> is pthread_self(), which is Python's threading.get_ident(); <ns> is CLOCK_REALTIME,
 * Python's time.time_ns(). Each line is one write(2) on an O_APPEND descriptor, so lines from
 * several threads never interleave, and nothing is lost when a pool process ends with _exit.
 *
 * With NVTX_RECORDER_DIR unset or empty it records nothing: a tool that is attached and does
 * no work, for measuring what the ranges cost the application itself (benchmarks/bench_nvtx.py).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nvtx3/nvToolsExt.h"

struct named {
    char name[256];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int out = -1;
static pid_t out_pid = 0;
static uint64_t next_range = 1;
static const char *out_dir = NULL;

static void clean(char *to, const char *from, size_t size) {
    size_t i = 0;
    for (; from != NULL && from[i] != '\0' && i + 1 < size; i++) {
        char c = from[i];
        to[i] = (c == '\t' || c == '\n' || c == '\r') ? ' ' : c;
    }
    to[i] = '\0';
}

static void emit(const char *line, int length) {
    if (out_dir == NULL) {
        return;
    }
    pthread_mutex_lock(&lock);
    if (out < 0 || out_pid != getpid()) { /* a forked child writes a file of its own */
        char path[4096];
        snprintf(path, sizeof path, "%s/nvtx-%d.tsv", out_dir, (int)getpid());
        out = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        out_pid = getpid();
    }
    if (out >= 0 && write(out, line, (size_t)length) != length) {
        /* a test reading the file finds the line missing: nothing else to do here */
    }
    pthread_mutex_unlock(&lock);
}

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static const char *domain_name(nvtxDomainHandle_t domain) {
    return domain != NULL ? ((struct named *)domain)->name : "(default)";
}

/* The message, category and colour of an event as text. */
static void describe(const nvtxEventAttributes_t *attributes, char *text, size_t size) {
    char message[1024] = "";
    if (attributes != NULL) {
        if (attributes->messageType == NVTX_MESSAGE_TYPE_ASCII) {
            clean(message, attributes->message.ascii, sizeof message);
        } else if (attributes->messageType == NVTX_MESSAGE_TYPE_REGISTERED && attributes->message.registered != NULL) {
            clean(message, ((struct named *)attributes->message.registered)->name, sizeof message);
        }
        snprintf(text, size, "%s\t%u\t%08x", message, attributes->category,
                 attributes->colorType == NVTX_COLOR_ARGB ? attributes->color : 0u);
    } else {
        snprintf(text, size, "\t0\t00000000");
    }
}

static struct named *named(const char *name) {
    struct named *made = calloc(1, sizeof *made);
    clean(made->name, name, sizeof made->name);
    return made;
}

static nvtxDomainHandle_t domain_create(const char *name) {
    struct named *made = named(name);
    char line[512];
    int n = snprintf(line, sizeof line, "domain\t%p\t%s\n", (void *)made, made->name);
    emit(line, n);
    return (nvtxDomainHandle_t)made;
}

static void domain_destroy(nvtxDomainHandle_t domain) { (void)domain; /* handles stay valid */ }

static nvtxStringHandle_t register_string(nvtxDomainHandle_t domain, const char *string) {
    (void)domain;
    return (nvtxStringHandle_t)named(string);
}

static void name_category(nvtxDomainHandle_t domain, uint32_t category, const char *name) {
    char text[256], line[768];
    clean(text, name, sizeof text);
    int n = snprintf(line, sizeof line, "category\t%s\t%u\t%s\n", domain_name(domain), category, text);
    emit(line, n);
}

/* A push, start or mark line: what, domain, thread, time, then `extra` (a range id and a tab, or
 * nothing), then the event's message, category and colour. */
static void event_line(const char *what, nvtxDomainHandle_t domain, const char *extra,
                       const nvtxEventAttributes_t *attributes) {
    char text[1200], line[1600];
    if (out_dir == NULL) { /* idle: not even the line is made */
        return;
    }
    describe(attributes, text, sizeof text);
    int n = snprintf(line, sizeof line, "%s\t%s\t%lu\t%llu\t%s%s\n", what, domain_name(domain),
                     (unsigned long)pthread_self(), now_ns(), extra, text);
    emit(line, n);
}

/* A pop or end line: what, domain, thread, time, then `extra` (a tab and a range id, or nothing). */
static void end_line(const char *what, nvtxDomainHandle_t domain, const char *extra) {
    char line[512];
    if (out_dir == NULL) {
        return;
    }
    int n = snprintf(line, sizeof line, "%s\t%s\t%lu\t%llu%s\n", what, domain_name(domain),
                     (unsigned long)pthread_self(), now_ns(), extra);
    emit(line, n);
}

static int range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attributes) {
    event_line("push", domain, "", attributes);
    return 0;
}

static int range_pop(nvtxDomainHandle_t domain) {
    end_line("pop", domain, "");
    return 0;
}

static nvtxRangeId_t range_start(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attributes) {
    char id_text[32];
    pthread_mutex_lock(&lock);
    nvtxRangeId_t id = next_range++;
    pthread_mutex_unlock(&lock);
    snprintf(id_text, sizeof id_text, "%llu\t", (unsigned long long)id);
    event_line("start", domain, id_text, attributes);
    return id;
}

static void range_end(nvtxDomainHandle_t domain, nvtxRangeId_t id) {
    char id_text[32];
    snprintf(id_text, sizeof id_text, "\t%llu", (unsigned long long)id);
    end_line("end", domain, id_text);
}

static void mark(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attributes) {
    event_line("mark", domain, "", attributes);
}

static void set(NvtxFunctionTable table, unsigned int size, unsigned int slot, NvtxFunctionPointer function) {
    if (slot < size && table[slot] != NULL) {
        *table[slot] = function;
    }
}

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
    const NvtxExportTableCallbacks *callbacks = (const NvtxExportTableCallbacks *)get_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    const char *dir = getenv("NVTX_RECORDER_DIR");
    out_dir = (dir != NULL && dir[0] != '\0') ? dir : NULL;
    if (callbacks == NULL || !callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) {
        return 0;
    }
    set(table, size, NVTX_CBID_CORE2_DomainCreateA, (NvtxFunctionPointer)domain_create);
    set(table, size, NVTX_CBID_CORE2_DomainDestroy, (NvtxFunctionPointer)domain_destroy);
    set(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, (NvtxFunctionPointer)register_string);
    set(table, size, NVTX_CBID_CORE2_DomainNameCategoryA, (NvtxFunctionPointer)name_category);
    set(table, size, NVTX_CBID_CORE2_DomainRangePushEx, (NvtxFunctionPointer)range_push);
    set(table, size, NVTX_CBID_CORE2_DomainRangePop, (NvtxFunctionPointer)range_pop);
    set(table, size, NVTX_CBID_CORE2_DomainRangeStartEx, (NvtxFunctionPointer)range_start);
    set(table, size, NVTX_CBID_CORE2_DomainRangeEnd, (NvtxFunctionPointer)range_end);
    set(table, size, NVTX_CBID_CORE2_DomainMarkEx, (NvtxFunctionPointer)mark);
    return 1;
}
