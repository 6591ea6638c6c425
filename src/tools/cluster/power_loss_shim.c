/* The power-loss shim of `ctrlog chaos` (src/tools/power_loss.rs builds it and preloads it into
 * each replica with LD_PRELOAD).
 *
 * A power loss keeps what the last completed fdatasync covered and may drop everything written
 * after it. A SIGKILL drops nothing (the page cache survives the process), so to emulate a power
 * loss on a real process this shim tells the fault injector how much of each WAL segment was
 * durable when the process died:
 *
 * - Before each fsync or fdatasync of a WAL segment (a file whose name ends in ".wal") it
 *   notes the file's size, and once the sync returns it appends "SIZE NAME\n" to
 *   $CTRLOG_POWER_LOSS_DIR/synced. The size is taken before the sync: everything written before
 *   the call is covered by it, and what another thread writes meanwhile is not vouched for.
 * - While $CTRLOG_POWER_LOSS_DIR/stall exists, a sync of a WAL segment blocks before it starts:
 *   the replica goes on writing, and acknowledging what it may acknowledge early, with nothing
 *   made durable, until it is killed.
 *
 * The injector then SIGKILLs the replica and cuts each segment back to its last noted size
 * (raft::storage::wal::lose_unsynced). Every other file (sled, the snapshot files, directories) passes
 * straight through: the emulation covers the WAL only.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char SEGMENT_SUFFIX[] = ".wal";

/* The segment's file name if `fd` is a WAL segment, else NULL. */
static const char *segment_name(int fd, char *path, size_t size)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(link, path, size - 1);
    size_t suffix = sizeof SEGMENT_SUFFIX - 1;
    if (len <= (ssize_t)suffix)
        return NULL;
    path[len] = '\0';
    if (strcmp(path + len - suffix, SEGMENT_SUFFIX) != 0)
        return NULL;
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static void wait_while_stalled(const char *dir)
{
    char flag[PATH_MAX];
    snprintf(flag, sizeof flag, "%s/stall", dir);
    const struct timespec poll = {.tv_sec = 0, .tv_nsec = 1000000};
    while (access(flag, F_OK) == 0)
        nanosleep(&poll, NULL);
}

static void note_synced(const char *dir, const char *name, off_t size)
{
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/synced", dir);
    int out = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (out < 0)
        return;
    char line[NAME_MAX + 32];
    int len = snprintf(line, sizeof line, "%lld %s\n", (long long)size, name);
    /* One write of a short line to an O_APPEND file: lines of concurrent syncs never mix. */
    if (write(out, line, (size_t)len) != len)
        perror("ctrlog power-loss shim: noting a sync");
    close(out);
}

static int sync_noted(const char *symbol, int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, symbol);
    const char *dir = getenv("CTRLOG_POWER_LOSS_DIR");
    char path[PATH_MAX];
    const char *name = dir ? segment_name(fd, path, sizeof path) : NULL;
    struct stat before;
    if (name == NULL || fstat(fd, &before) != 0)
        return real(fd);
    wait_while_stalled(dir);
    int result = real(fd);
    if (result == 0)
        note_synced(dir, name, before.st_size);
    return result;
}

int fdatasync(int fd) { return sync_noted("fdatasync", fd); }

int fsync(int fd) { return sync_noted("fsync", fd); }
