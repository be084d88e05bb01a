// core/fileio.c — see fileio.h.
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int fc_commit_tmp(FILE *fp, const char *tmp, const char *path, fc_error *e) {
    // A full disk often shows up only at fflush, fsync or even fclose.
    const char *failed = NULL;
    if (ferror(fp)) failed = "write";
    if (!failed && fflush(fp) != 0) failed = "flush";
    if (!failed && fsync(fileno(fp)) != 0) failed = "fsync";
    int err = errno;
    if (fclose(fp) != 0 && !failed) failed = "close", err = errno;
    if (!failed && rename(tmp, path) != 0) failed = "rename", err = errno;
    if (failed) {
        unlink(tmp);  // never leave a partial file behind
        return fc_fail(e, "%s: cannot %s %s: %s", path, failed, tmp, strerror(err));
    }
    fsync_parent_dir(path);
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
    return fc_commit_tmp(fp, tmp, path, e);
}
