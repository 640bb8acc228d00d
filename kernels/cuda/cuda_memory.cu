// The backend's memory ops and weight upload.
#include "backend_cuda.cuh"

extern "C" {
#include "threadpool.h"
}

void *cu_alloc(backend *b, size_t bytes)
{
    cu_impl *c = enter(b);
    void *p = NULL;
    cudaError_t e = cudaMallocAsync(&p, bytes ? bytes : 256, c->st);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail(c, "out of device memory allocating %zu bytes", bytes);
        return NULL;
    }
    CK(c, cudaMemsetAsync(p, 0, bytes, c->st));
    return p;
}

void cu_release(backend *b, void *p)
{
    if (!p) return;
    cu_impl *c = enter(b);
    c->gen++;
    c->held.x = NULL;   // its memory may come back as another buffer
    CK(c, cudaFreeAsync(p, c->st));
}

void cu_copy_rows(backend *b, float *dst, int ldd, const float *src, int lds, int rows,
                         int n)
{
    cu_impl *c = enter(b);
    if (rows <= 0 || n <= 0 || recording(c)) return;
    CK(c, cudaMemcpy2DAsync(dst, ldd * sizeof(float), src, lds * sizeof(float), n * sizeof(float),
                            rows, cudaMemcpyDeviceToDevice, c->st));
    launched(c, "copy_rows");
}

void cu_write(backend *b, void *dst, const void *src, size_t bytes)
{
    cu_impl *c = enter(b);
    CK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->st));
    CK(c, cudaStreamSynchronize(c->st));
}

void cu_read(backend *b, void *dst, const void *src, size_t bytes)
{
    cu_impl *c = enter(b);
    CK(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->st));
    CK(c, cudaStreamSynchronize(c->st));
}

// The prefix cache's host tier (backend.h): pinned memory every device
// can reach, and copies on a stream of their own (created on first use),
// so queuing them never waits for the compute stream and their transfers
// run beside its kernels.  The copy stream waits for the ops issued before
// the first copy of a batch (a spilled block is final), the compute stream
// for the batch at copy_fence (a filled block is read, a spilled one
// reused, only after its copy); the host waits for neither.
void *cu_host_alloc(backend *b, size_t bytes)
{
    enter(b);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

void cu_host_free(backend *b, void *p)
{
    if (!p) return;
    cu_impl *c = enter(b);
    CK(c, cudaFreeHost(p));
}

void cu_copy_async(backend *b, void *dst, const void *src, size_t bytes, bool to_host)
{
    cu_impl *c = enter(b);
    if (!c->cst) {
        CK(c, cudaStreamCreateWithFlags(&c->cst, cudaStreamNonBlocking));
        CK(c, cudaEventCreateWithFlags(&c->cev[0], cudaEventDisableTiming));
        CK(c, cudaEventCreateWithFlags(&c->cev[1], cudaEventDisableTiming));
        if (c->failed) return;
    }
    if (!c->cpend) {
        CK(c, cudaEventRecord(c->cev[0], c->st));
        CK(c, cudaStreamWaitEvent(c->cst, c->cev[0], 0));
        c->cpend = true;
    }
    CK(c, cudaMemcpyAsync(dst, src, bytes,
                          to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, c->cst));
}

void cu_copy_fence(backend *b, bool wait)
{
    cu_impl *c = enter(b);
    if (c->cpend) {
        CK(c, cudaEventRecord(c->cev[1], c->cst));
        CK(c, cudaStreamWaitEvent(c->st, c->cev[1], 0));
        c->cpend = false;
    }
    if (wait && c->cst) CK(c, cudaStreamSynchronize(c->cst));
}

void copies_free(cu_impl *c)
{
    if (!c->cst) return;
    cudaStreamSynchronize(c->cst);
    cudaEventDestroy(c->cev[0]);
    cudaEventDestroy(c->cev[1]);
    cudaStreamDestroy(c->cst);
    c->cst = NULL;
}

static void own(cu_impl *c, void *p)
{
    if (c->nowned == c->capowned) {
        c->capowned = c->capowned ? 2 * c->capowned : 256;
        c->owned = (void **)realloc(c->owned, c->capowned * sizeof *c->owned);
    }
    c->owned[c->nowned++] = p;
}

static void *dev_alloc(cu_impl *c, size_t bytes)
{
    void *p = NULL;
    if (bytes < 256) bytes = 256;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        fail(c, "out of device memory uploading %zu bytes", bytes);
        return NULL;
    }
    own(c, p);
    CK(c, cudaMemsetAsync(p, 0, bytes, c->st));
    return p;
}

// Uploads from the checkpoint's mapping (pageable memory) go through two
// pinned buffers: host threads pack rows into one while the other's DMA
// runs.  A copy straight from pageable memory measured 7.0 GB/s on the
// H200 (run S1): the driver stages it through its own buffer, one host
// thread at a time; pinning the mapping itself (cudaHostRegister) did
// not finish in 150 s there.
typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    size_t spitch, width, b0, b1;   // bytes [b0, b1) of the packed rows
    int ntasks;                     // shares of them
} pack_job;

// Task t of threadpool_run: the t-th of ntasks equal shares of the bytes.
static void pack_part(void *arg, int t)
{
    const pack_job *j = (const pack_job *)arg;
    size_t b0 = j->b0 + (j->b1 - j->b0) * t / j->ntasks;
    size_t b1 = j->b0 + (j->b1 - j->b0) * (t + 1) / j->ntasks;
    for (size_t b = b0; b < b1;) {
        size_t r = b / j->width, col = b % j->width;
        size_t n = j->width - col < b1 - b ? j->width - col : b1 - b;
        memcpy(j->dst + b, j->src + r * j->spitch + col, n);
        b += n;
    }
}

// rows of width bytes, spitch apart, packed into dst; from 1 MB on split
// over the upload's pool (one memcpy thread does not keep up with the
// DMA; the pool's threads persist: run D5 saw 8-16 threads made per
// buffer slower than 4)
static void pack_rows(cu_impl *c, uint8_t *dst, const uint8_t *src, size_t spitch, size_t width,
                      size_t rows)
{
    size_t total = rows * width;
    pack_job j = { dst, src, spitch, width, 0, total, 1 };
    if (total >= ((size_t)1 << 20) && c->up_pool) j.ntasks = threadpool_size(c->up_pool);
    if (j.ntasks > 1) threadpool_run(c->up_pool, pack_part, &j, j.ntasks);
    else pack_part(&j, 0);
}

static bool stage_ready(cu_impl *c)
{
    if (c->up_buf[0]) return true;
    for (int i = 0; i < 2; i++) {
        if (cudaHostAlloc(&c->up_buf[i], c->up_bytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();     // no pinned memory: copy from the source as it is
            uploads_free(c);
            c->up_bytes = 0;
            return false;
        }
        CK(c, cudaEventCreateWithFlags(&c->up_ev[i], cudaEventDisableTiming));
    }
    if (c->up_threads > 1 && !(c->up_pool = threadpool_new(c->up_threads)))
        fail(c, "weight upload: no memory for %d packing threads", c->up_threads);
    return !c->failed;
}

// cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows) from host
// memory, through the staging buffers when rows fit in one; the source
// may be reused once the stream has run the copies (the callers sync).
static void upload_rows(cu_impl *c, uint8_t *dst, size_t dpitch, const uint8_t *src,
                        size_t spitch, size_t width, size_t rows)
{
    if (!rows || !width) return;
    if (width > c->up_bytes || !stage_ready(c)) {
        CK(c, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyHostToDevice,
                                c->st));
        return;
    }
    size_t per = c->up_bytes / width;
    for (size_t r = 0; r < rows && !c->failed; r += per) {
        size_t n = rows - r < per ? rows - r : per;
        int i = c->up_next;
        c->up_next ^= 1;
        CK(c, cudaEventSynchronize(c->up_ev[i]));  // its last transfer is done
        pack_rows(c, c->up_buf[i], src + r * spitch, spitch, width, n);
        CK(c, cudaMemcpy2DAsync(dst + r * dpitch, dpitch, c->up_buf[i], width, width, n,
                                cudaMemcpyHostToDevice, c->st));
        CK(c, cudaEventRecord(c->up_ev[i], c->st));
    }
}

void uploads_free(cu_impl *c)
{
    for (int i = 0; i < 2; i++) {
        if (c->up_ev[i]) {
            cudaEventSynchronize(c->up_ev[i]);
            cudaEventDestroy(c->up_ev[i]);
        }
        if (c->up_buf[i]) cudaFreeHost(c->up_buf[i]);
        c->up_buf[i] = NULL;
        c->up_ev[i] = NULL;
    }
    if (c->up_pool) threadpool_free(c->up_pool);
    c->up_pool = NULL;
}

void *cu_upload(backend *b, const void *host, size_t bytes)
{
    cu_impl *c = enter(b);
    uint8_t *p = (uint8_t *)dev_alloc(c, bytes);
    if (!p) return NULL;
    // as rows of 1 MiB (a buffer holds many) and the rest
    size_t w = bytes < ((size_t)1 << 20) ? bytes : (size_t)1 << 20, n = w ? bytes / w : 0;
    upload_rows(c, p, w, (const uint8_t *)host, w, w, n);
    upload_rows(c, p + n * w, w, (const uint8_t *)host + n * w, w, bytes - n * w, 1);
    CK(c, cudaStreamSynchronize(c->st));
    return c->failed ? NULL : p;
}

// The rectangle of stored rows/columns covering the view, its origin
// aligned to the scale blocks (FP8 128x128, MXFP4 1x32) and to 16 bytes,
// each row padded to 16 bytes; n views packed one after another.
int cu_upload_weights(backend *b, qweight *w, int n)
{
    cu_impl *c = enter(b);
    const qweight *q = &w[0];
    int ra = 1, ca, es;         // row / column alignment, bits per element
    switch (q->type) {
    case QT_F32: ca = 4; es = 32; break;
    case QT_BF16: ca = 8; es = 16; break;
    case QT_FP8: ra = 128; ca = 128; es = 8; break;
    default: ca = 32; es = 4; break;
    }
    int pad = 128 / es;         // elements per 16 bytes
    int R0 = q->row0 / ra * ra, C0 = q->col0 / ca * ca;
    long long nr = q->row0 + q->rows - R0, nc = q->col0 + q->cols - C0;
    long long ld = round_up(nc, pad);
    size_t row_bytes = ld * es / 8, src_pitch = q->ld * es / 8, width = (nc * es + 7) / 8;
    size_t data_bytes = round_up(nr * row_bytes, 256);
    long long srows = 0, scols = 0, sr0 = 0, sc0 = 0;
    if (q->type == QT_FP8) {
        srows = (nr + 127) / 128, scols = (nc + 127) / 128, sr0 = R0 / 128, sc0 = C0 / 128;
    } else if (q->type == QT_MXFP4) {
        srows = nr, scols = (nc + 31) / 32, sr0 = R0, sc0 = C0 / 32;
    }
    size_t scale_bytes = round_up(srows * scols, 256);
    uint8_t *data = (uint8_t *)dev_alloc(c, (size_t)n * data_bytes);
    uint8_t *scale = scale_bytes ? (uint8_t *)dev_alloc(c, (size_t)n * scale_bytes) : NULL;
    if (!data || (scale_bytes && !scale)) return -1;
    if (!q->data) {     // synthetic: values of the format, std about 1/sqrt(cols)
        static const int kinds[] = { FILL_F32, FILL_BF16, FILL_FP8, FILL_BYTES };
        float amp = sqrtf(3.0f / (q->cols > 0 ? q->cols : 1));
        cu_fill(c->st, data, (size_t)n * data_bytes, kinds[q->type], amp, 0,
                ((unsigned long long)c->rank << 48) ^ ++c->fills);
        // FP8 codes average about 1, E2M1 about 2: scales 2^-6 and 2^-7.
        if (scale) cu_fill(c->st, scale, (size_t)n * scale_bytes, FILL_CONST, 0,
                           q->type == QT_FP8 ? 121 : 120, 0);
        phase(c, "synthetic weights");   // the shadow below: a span of its own
    }
    // fp8_shadow: the whole copy in bf16 too (same ld), made below
    size_t bf_bytes = q->type == QT_FP8 && c->fp8_shadow ? round_up(nr * ld * 2, 256) : 0;
    uint8_t *bf = bf_bytes ? (uint8_t *)dev_alloc(c, (size_t)n * bf_bytes) : NULL;
    if (bf_bytes && !bf) return -1;
    for (int i = 0; i < n; i++) {
        const uint8_t *src = (const uint8_t *)w[i].data + (size_t)R0 * src_pitch + C0 * es / 8;
        if (q->data && nr > 0)
            upload_rows(c, data + i * data_bytes, row_bytes, src, src_pitch, width, nr);
        if (q->data && scale_bytes)
            upload_rows(c, scale + i * scale_bytes, scols, w[i].scale + sr0 * w[i].scale_ld + sc0,
                        w[i].scale_ld, scols, srows);
        cuda_qw *d = (cuda_qw *)calloc(1, sizeof *d);
        *d = cuda_qw{ data + i * data_bytes, scale ? scale + i * scale_bytes : NULL, ld, scols,
                      (long long)data_bytes, (long long)scale_bytes, R0, C0,
                      bf ? bf + i * bf_bytes : NULL, (long long)bf_bytes };
        if (c->ndescs == c->capdescs) {
            c->capdescs = c->capdescs ? 2 * c->capdescs : 256;
            c->descs = (cuda_qw **)realloc(c->descs, c->capdescs * sizeof *c->descs);
        }
        c->descs[c->ndescs++] = d;
        w[i].dev = d;
    }
    if (bf) {   // ld elements a row of each copy, whole 16-byte rows (zeros past nc)
        dqw all = { QT_FP8, (int)nr, (int)ld, data, scale, ld, scols, 0, 0,
                    (long long)data_bytes, (long long)scale_bytes };
        cu_dequant(c->st, all, n, true, bf, ld);
        launched(c, "fp8 shadow");
    }
    CK(c, cudaStreamSynchronize(c->st));
    return c->failed ? -1 : 0;
}

// Frees p if it is an allocation of c's own (a weight's whole copy).
static bool disown(cu_impl *c, const void *p)
{
    for (int i = 0; i < c->nowned; i++)
        if (c->owned[i] == p) {
            CK(c, cudaFree(c->owned[i]));
            c->owned[i] = c->owned[--c->nowned];
            return true;
        }
    return false;
}

// Matrices of one width that the model multiplies by the same x
// (backend.h join_weights): their bf16 forms (FP8's copy, BF16's data)
// moved back to back into one allocation, each matrix's rows where they
// were in its own, so that lt_joined multiplies them as one GEMM.  Each
// old copy is freed (each was one upload of its own): no memory added.
int cu_join_weights(backend *b, qweight *const *w, int n)
{
    cu_impl *c = enter(b);
    if (n < 2 || !c->join) return 1;
    long long ld = 0, rows = 0;
    for (int i = 0; i < n; i++) {
        const cuda_qw *d = (const cuda_qw *)w[i]->dev;
        const uint8_t *src = !d ? NULL : w[i]->type == QT_FP8 ? d->bf : w[i]->type == QT_BF16 ? d->data : NULL;
        if (!src || w[i]->rows <= 0 || w[i]->cols != w[0]->cols || w[i]->row0 != d->row0 ||
            w[i]->col0 != d->col0 || (i && d->ld != ld))
            return 1;
        ld = d->ld, rows += w[i]->rows;
    }
    uint8_t *all = (uint8_t *)dev_alloc(c, round_up(rows * ld * 2, 256));
    if (!all) return -1;
    long long at = 0;
    for (int i = 0; i < n; i++) {
        cuda_qw *d = (cuda_qw *)w[i]->dev;
        const uint8_t **src = w[i]->type == QT_FP8 ? &d->bf : &d->data;
        size_t bytes = (size_t)w[i]->rows * ld * 2;
        CK(c, cudaMemcpyAsync(all + at, *src, bytes, cudaMemcpyDeviceToDevice, c->st));
        CK(c, cudaStreamSynchronize(c->st));
        disown(c, *src);
        *src = all + at;
        at += bytes;
    }
    return c->failed ? -1 : 0;
}

void cu_mem_info(backend *b, size_t *free_bytes, size_t *total_bytes)
{
    cu_impl *c = enter(b);
    CK(c, cudaStreamSynchronize(c->st));
    // Memory released to the stream-ordered pool counts as free.
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, c->dev) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
    CK(c, cudaMemGetInfo(free_bytes, total_bytes));
}
