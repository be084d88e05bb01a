// core/fileio.c — see fileio.h.
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fc_read_file_limited(const char *path, size_t limit, char **out, size_t *len, fc_error *e) {
    *out = NULL;
    *len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int err = errno;
        fc_fail(e, "%s: cannot open: %s", path, strerror(err));
        errno = err;
        return FC_READ_CANNOT_OPEN;
    }
    struct stat st;
    int regular = fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode);
    if (regular && (uint64_t)st.st_size > limit) {
        fclose(fp);
        fc_fail(e, "%s: larger than %zu bytes", path, limit);
        return FC_READ_TOO_LARGE;
    }
    // A regular file fits its size plus one byte (so that growth shows); a
    // pipe starts small and doubles up to one byte past the limit.
    size_t cap = regular ? (size_t)st.st_size + 1 : (limit < 16384 ? limit + 1 : 16384), n = 0;
    char *buf = mallocCheck(cap + 1);  // + 1: the NUL
    for (;;) {
        size_t want = cap - n, k = fread(buf + n, 1, want, fp);
        n += k;
        if (k < want || n > limit) break;  // a short read is the end (or an error)
        cap = cap > limit / 2 ? limit + 1 : 2 * cap;
        buf = reallocCheck(buf, cap + 1);
    }
    int bad = ferror(fp);
    fclose(fp);
    int rc = 0;
    if (bad) rc = FC_READ_FAILED, fc_fail(e, "%s: read error", path);
    else if (n > limit) rc = FC_READ_TOO_LARGE, fc_fail(e, "%s: larger than %zu bytes", path, limit);
    else if (regular && n != (size_t)st.st_size)
        rc = FC_READ_FAILED, fc_fail(e, "%s: changed size while being read", path);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

int fc_mkdir_p(const char *path, fc_error *e) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return fc_fail(e, "%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        int end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return fc_fail(e, "cannot create directory %s: %s", buf, strerror(errno));
            struct stat st;
            if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
                return fc_fail(e, "%s exists and is not a directory", buf);
            if (end) break;
            *p = '/';
        }
    }
    return 0;
}

FILE *fc_open_tmp(const char *path, char *tmp, size_t tmp_len, fc_error *e) {
    if (snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid()) >= (int)tmp_len) {
        fc_fail(e, "%s: path too long", path);
        return NULL;
    }
    FILE *fp = fopen(tmp, "wb");
    if (!fp) fc_fail(e, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    return fp;
}

// Best effort: some file systems refuse fsync on a directory, and by then
// the files in it are complete and in place, so failing there would be wrong.
void fc_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

// After the rename, make the new directory entry durable too.
static void fsync_parent_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    fc_fsync_dir(dir);
}

int fc_commit_tmp(FILE *fp, const char *tmp, const char *path, fc_commit_kind kind, fc_error *e) {
    // A full disk often shows up only at fflush, fsync or even fclose.
    const char *failed = NULL;
    if (ferror(fp)) failed = "write";
    if (!failed && fflush(fp) != 0) failed = "flush";
    if (!failed && kind == FC_DURABLE && fsync(fileno(fp)) != 0) failed = "fsync";
    int err = errno;
    if (fclose(fp) != 0 && !failed) failed = "close", err = errno;
    if (!failed && rename(tmp, path) != 0) failed = "rename", err = errno;
    if (failed) {
        unlink(tmp);  // never leave a partial file behind
        return fc_fail(e, "%s: cannot %s %s: %s", path, failed, tmp, strerror(err));
    }
    if (kind == FC_DURABLE) fsync_parent_dir(path);
    return 0;
}

void fc_abort_tmp(FILE *fp, const char *tmp) {
    fclose(fp);
    unlink(tmp);
}

int fc_write_file_atomic(const char *path, const void *data, size_t len, fc_error *e) {
    char tmp[4200];
    FILE *fp = fc_open_tmp(path, tmp, sizeof tmp, e);
    if (!fp) return -1;
    if (len && fwrite(data, 1, len, fp) != len) {
        fc_abort_tmp(fp, tmp);
        return fc_fail(e, "%s: cannot write %s: short write", path, tmp);
    }
    return fc_commit_tmp(fp, tmp, path, FC_DURABLE, e);
}
