/* Compiled twin of DRAMPerfModel._simulate_py (sim/perf/dram.py): the same event-driven, command-level replay of
 * the memory controller's queue and arbitration, line for line, plus the device memory system's front end
 * (EntryFrontend). Built on first use by sim/perf/dram.py (gcc -O2 -shared) and checked against the Python
 * implementation by tests/sim/perf/test_dram_perf.py; any difference is a bug in one of them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;

#define INF ((i64)1 << 62)

static inline i64 mx(i64 a, i64 b) { return a > b ? a : b; }

/* Timing / structure parameters, in this order (keep in step with dram.py _KERNEL_PARAMS). */
enum {
    P_NB, P_NG, P_R, P_GK, P_Q, P_INORDER, P_MAXP, P_RD_DEPTH, P_RESP,
    P_CL, P_BC, P_CWL, P_RD_RD_XR, P_RD_WR_XR, P_WR_RD, P_WR_RD_XR, P_WR_WR_XR,
    P_tRC, P_tRCD, P_tRAS, P_tRP, P_tRTP, P_tRRD_S, P_tRRD_L, P_tFAW, P_tCCD_S, P_tCCD_L,
    P_WRP, P_WTRL, P_WTRS, P_tRPab, P_tRFC, P_tREFI,
    /* front end: FE_ON (0/1), bursts per entry, FIFO depth, ROB slots (<0: unbounded), start cycle, resp delay */
    P_FE_ON, P_FE_S, P_FE_FD, P_FE_DN, P_FE_START, P_FE_RESPD,
    P_COUNT
};

typedef struct {
    int S, FD, DN;
    i64 start, respd;
    int ne, nr;
    i64 *G, *C, *A, *last_col, *resp, *pops;
    int *left, *rd_pos, *rd_order;
    unsigned char *e_rd;
    int npops, next_entry;
} FE;

static int fe_pop(FE *f, int i, i64 *out) {
    while (f->npops <= i) {
        int k = f->rd_order[f->npops];
        i64 r = f->resp[k];
        if (r < 0) return 0;
        i64 p = r + 1;
        if (f->npops && f->pops[f->npops - 1] + 1 > p) p = f->pops[f->npops - 1] + 1;
        f->pops[f->npops++] = p;
    }
    *out = f->pops[i];
    return 1;
}

/* Presentation cycle of request j; 0 = unknown yet (a pop not yet determined). */
static int fe_present(FE *f, int j, i64 *out) {
    int k = j / f->S, s = j % f->S;
    if (s) { *out = f->A[j - 1] + 1; return 1; }
    if (k >= f->next_entry) {
        i64 g = k == 0 ? f->start : f->G[k - 1] + 1;
        if (k >= f->FD) g = mx(g, f->C[k - f->FD]);
        if (f->e_rd[k] && f->DN >= 0) {
            int i = f->rd_pos[k] - f->DN;
            if (i >= 0) {
                i64 p;
                if (!fe_pop(f, i, &p)) return 0;
                g = mx(g, p + 1);
            }
        }
        f->G[k] = g;
        i64 c = g + 2;
        if (k) c = mx(c, f->A[j - 1] + 1);
        f->C[k] = c;
        f->next_entry = k + 1;
    }
    *out = f->C[k];
    return 1;
}

/* Returns 0 on success, < 0 on bad input / allocation failure. out: cycles, acts, pres, refs. */
int dram_simulate(const i64 *P, int n, const int32_t *rank_l, const int32_t *grp_l, const int32_t *bank_l,
                  const int32_t *row_l, const int32_t *col_l, const unsigned char *wr_l, i64 *col, i64 *out) {
    const int NB = (int)P[P_NB], NG = (int)P[P_NG], R = (int)P[P_R], GK = (int)P[P_GK], Q = (int)P[P_Q];
    const int inorder = (int)P[P_INORDER], maxp = (int)P[P_MAXP], RD_DEPTH = (int)P[P_RD_DEPTH];
    const i64 RESP = P[P_RESP], CL = P[P_CL], BC = P[P_BC], CWL = P[P_CWL];
    const i64 rd_rd_xr = P[P_RD_RD_XR], rd_wr_xr = P[P_RD_WR_XR], wr_rd = P[P_WR_RD], wr_rd_xr = P[P_WR_RD_XR];
    const i64 wr_wr_xr = P[P_WR_WR_XR];
    const i64 tRC = P[P_tRC], tRCD = P[P_tRCD], tRAS = P[P_tRAS], tRP = P[P_tRP], tRTP = P[P_tRTP];
    const i64 tRRD_S = P[P_tRRD_S], tRRD_L = P[P_tRRD_L], tFAW = P[P_tFAW], tCCD_S = P[P_tCCD_S];
    const i64 tCCD_L = P[P_tCCD_L], WRP = P[P_WRP], WTRL = P[P_WTRL], WTRS = P[P_WTRS];
    const i64 tRPab = P[P_tRPab], tRFC = P[P_tRFC], tREFI = P[P_tREFI];
    if (n <= 0 || Q < 1 || Q > 64 || R < 1 || R > 64 || NB < 1 || RD_DEPTH < 1 || RD_DEPTH > 1024) return -1;

    int rc = -2;
    unsigned char *b_open = calloc(NB, 1);
    i64 *b_row = malloc(sizeof(i64) * NB), *b_act = calloc(NB, sizeof(i64)), *b_col = calloc(NB, sizeof(i64));
    i64 *b_pre = calloc(NB, sizeof(i64));
    i64 *g_ccd = calloc(NG, sizeof(i64)), *g_rrd = calloc(NG, sizeof(i64)), *g_wtr = calloc(NG, sizeof(i64));
    i64 *r_ccd = calloc(R, sizeof(i64)), *r_rrd = calloc(R, sizeof(i64)), *r_wtr = calloc(R, sizeof(i64));
    i64 *r_rdbus = calloc(R, sizeof(i64)), *r_wrbus = calloc(R, sizeof(i64)), *r_faw = calloc(4 * R, sizeof(i64));
    int *r_fawp = calloc(R, sizeof(int)), *rank_q = calloc(R, sizeof(int));
    i64 *next_tick = malloc(sizeof(i64) * R);
    int *owed = calloc(R, sizeof(int));
    unsigned *seen_b = calloc(NB, sizeof(unsigned));
    i64 rd_out[1024];
    int rd_h = 0, rd_n = 0;
    i64 wslot[64];
    int ws_h = 0, ws_n = 0;
    int queue[64];
    int qn = 0;
    FE fe;
    memset(&fe, 0, sizeof fe);
    const int fe_on = (int)P[P_FE_ON];
    if (!b_open || !b_row || !b_act || !b_col || !b_pre || !g_ccd || !g_rrd || !g_wtr || !r_ccd || !r_rrd ||
        !r_wtr || !r_rdbus || !r_wrbus || !r_faw || !r_fawp || !rank_q || !next_tick || !owed || !seen_b)
        goto done;
    if (fe_on) {
        fe.S = (int)P[P_FE_S]; fe.FD = (int)P[P_FE_FD]; fe.DN = (int)P[P_FE_DN];
        fe.start = P[P_FE_START]; fe.respd = P[P_FE_RESPD];
        if (fe.S < 1 || n % fe.S || fe.FD < 1) { rc = -1; goto done; }
        fe.ne = n / fe.S;
        fe.G = calloc(fe.ne, sizeof(i64)); fe.C = calloc(fe.ne, sizeof(i64)); fe.A = calloc(n, sizeof(i64));
        fe.last_col = calloc(fe.ne, sizeof(i64)); fe.resp = malloc(sizeof(i64) * fe.ne);
        fe.pops = calloc(fe.ne, sizeof(i64)); fe.left = malloc(sizeof(int) * fe.ne);
        fe.rd_pos = calloc(fe.ne, sizeof(int)); fe.rd_order = calloc(fe.ne, sizeof(int));
        fe.e_rd = malloc(fe.ne);
        if (!fe.G || !fe.C || !fe.A || !fe.last_col || !fe.resp || !fe.pops || !fe.left || !fe.rd_pos ||
            !fe.rd_order || !fe.e_rd) goto done;
        for (int k = 0; k < fe.ne; ++k) {
            fe.e_rd[k] = !wr_l[k * fe.S];
            fe.left[k] = fe.S;
            fe.resp[k] = -1;
            fe.rd_pos[k] = fe.nr;
            if (fe.e_rd[k]) fe.rd_order[fe.nr++] = k;
        }
    }
    for (int b = 0; b < NB; ++b) b_row[b] = -1;
    for (int r = 0; r < R; ++r) next_tick[r] = tREFI - 1 + r * (tREFI / R);

    int ref_active = 0, ref_rank = 0;
    int wq = 0, nxt = 0, done_n = 0;
    i64 acts = 0, pres = 0, refs = 0, t = 0;
    unsigned gen = 0;
    while (done_n < n) {
        while (rd_n && rd_out[rd_h] <= t) { rd_h = (rd_h + 1) % 1024; --rd_n; }
        while (ws_n && wslot[ws_h] <= t) { ws_h = (ws_h + 1) % 64; --ws_n; }
        const int credit = rd_n < RD_DEPTH;
        int issued = 0, sel_col = -1, is_ref = 0, jsel = -1;
        i64 wake = INF;
        const int blk = ref_active ? ref_rank : -1;
        if (ref_active) {
            const int b0 = ref_rank * GK;
            int any = 0;
            for (int b = b0; b < b0 + GK; ++b) any |= b_open[b];
            if (any) {
                i64 tp = 0;
                for (int b = b0; b < b0 + GK; ++b) tp = mx(tp, b_pre[b]);
                if (tp <= t) {
                    for (int b = b0; b < b0 + GK; ++b) { b_open[b] = 0; if (b_act[b] < t + tRPab) b_act[b] = t + tRPab; }
                    ++pres;
                    issued = 1;
                } else wake = tp;
            } else {
                i64 ta = 0;
                for (int b = b0; b < b0 + GK; ++b) ta = mx(ta, b_act[b]);
                if (ta <= t) {
                    for (int b = b0; b < b0 + GK; ++b) if (b_act[b] < t + tRFC) b_act[b] = t + tRFC;
                    ++refs;
                    issued = is_ref = 1;
                } else wake = ta;
            }
        }
        if (!issued) {
            int sel_row = -1, row_kind = 0;
            ++gen;
            if (gen == 0) { memset(seen_b, 0, sizeof(unsigned) * NB); gen = 1; }
            for (int p = 0; p < qn; ++p) {
                const int j = queue[p], b = bank_l[j], r = rank_l[j];
                if (b_open[b] && b_row[b] == row_l[j]) {
                    if (sel_col < 0 && r != blk && (!inorder || p == 0)) {
                        const int gi = grp_l[j];
                        i64 tc;
                        if (wr_l[j]) tc = mx(mx(b_col[b], g_ccd[gi]), mx(r_ccd[r], r_wrbus[r]));
                        else {
                            tc = mx(mx(mx(b_col[b], g_ccd[gi]), mx(r_ccd[r], r_rdbus[r])), mx(g_wtr[gi], r_wtr[r]));
                            if (!credit) tc = mx(tc, mx(t + 1, rd_out[rd_h]));
                        }
                        /* An entry behind an older request to the same burst is no candidate. The Python twin skips
                         * it before looking at tc; checking it only for a legal entry saves the O(Q) scan, and an
                         * extra wake-up cycle changes nothing (nothing happens in a cycle without an event). */
                        if (tc <= t) {
                            int older = 0;
                            for (int q = 0; q < p; ++q) {
                                const int i = queue[q];
                                if (bank_l[i] == b && row_l[i] == row_l[j] && col_l[i] == col_l[j]) { older = 1; break; }
                            }
                            if (!older) sel_col = p;
                        } else if (tc < wake) wake = tc;
                    }
                } else if (sel_row < 0 && r != blk && seen_b[b] != gen) {
                    i64 tr;
                    int k;
                    if (b_open[b]) { tr = b_pre[b]; k = 1; }
                    else {
                        const int gi = grp_l[j];
                        tr = mx(mx(b_act[b], g_rrd[gi]), mx(r_rrd[r], r_faw[4 * r + r_fawp[r]]));
                        k = 2;
                    }
                    if (tr <= t) { sel_row = p; row_kind = k; }
                    else if (tr < wake) wake = tr;
                }
                seen_b[b] = gen;
                if (sel_col >= 0) break;
            }
            if (sel_col >= 0) {
                const int j = queue[sel_col];
                jsel = j;
                memmove(queue + sel_col, queue + sel_col + 1, sizeof(int) * (qn - sel_col - 1));
                --qn;
                const int b = bank_l[j], r = rank_l[j], gi = grp_l[j];
                g_ccd[gi] = mx(g_ccd[gi], t + tCCD_L);
                r_ccd[r] = mx(r_ccd[r], t + tCCD_S);
                if (wr_l[j]) {
                    if (ws_n >= 64) { rc = -3; goto done; }
                    wslot[(ws_h + ws_n) % 64] = t + CWL + 1; ++ws_n;
                    b_pre[b] = mx(b_pre[b], t + WRP);
                    g_wtr[gi] = mx(g_wtr[gi], t + WTRL);
                    r_wtr[r] = mx(r_wtr[r], t + WTRS);
                    for (int r2 = 0; r2 < R; ++r2) if (r2 != r) {
                        r_rdbus[r2] = mx(r_rdbus[r2], t + rd_wr_xr);
                        r_wrbus[r2] = mx(r_wrbus[r2], t + wr_wr_xr);
                    }
                } else {
                    b_pre[b] = mx(b_pre[b], t + tRTP);
                    rd_out[(rd_h + rd_n) % 1024] = t + RESP; ++rd_n;
                    r_wrbus[r] = mx(r_wrbus[r], t + wr_rd);
                    for (int r2 = 0; r2 < R; ++r2) if (r2 != r) {
                        r_rdbus[r2] = mx(r_rdbus[r2], t + rd_rd_xr);
                        r_wrbus[r2] = mx(r_wrbus[r2], t + wr_rd_xr);
                    }
                }
                col[j] = t + 1;
                ++done_n;
                issued = 1;
                if (fe_on) {
                    const int k = j / fe.S;
                    if (t + 1 > fe.last_col[k]) fe.last_col[k] = t + 1;
                    if (--fe.left[k] == 0 && fe.e_rd[k]) fe.resp[k] = fe.last_col[k] + fe.respd;
                }
            } else if (sel_row >= 0) {
                const int j = queue[sel_row], b = bank_l[j], r = rank_l[j], gi = grp_l[j];
                if (row_kind == 1) {
                    b_open[b] = 0;
                    b_act[b] = mx(b_act[b], t + tRP);
                    ++pres;
                } else {
                    b_open[b] = 1;
                    b_row[b] = row_l[j];
                    b_act[b] = mx(b_act[b], t + tRC);
                    b_col[b] = mx(b_col[b], t + tRCD);
                    b_pre[b] = mx(b_pre[b], t + tRAS);
                    g_rrd[gi] = mx(g_rrd[gi], t + tRRD_L);
                    r_rrd[r] = mx(r_rrd[r], t + tRRD_S);
                    const int p = r_fawp[r];
                    r_faw[4 * r + p] = mx(r_faw[4 * r + p], t + tFAW);
                    r_fawp[r] = (p + 1) & 3;
                    ++acts;
                }
                issued = 1;
            }
        }
        /* refresh bookkeeping (has_req: the queue of cycle t, before this cycle's removal and push) */
        int changed = issued, new_active = ref_active;
        if (!ref_active) {
            int cand = -1;
            for (int r = 0; r < R; ++r) if (owed[r] >= maxp) { cand = r; break; }
            if (cand < 0) for (int r = 0; r < R; ++r) if (owed[r] && rank_q[r] == 0) { cand = r; break; }
            if (cand >= 0) { new_active = 1; ref_rank = cand; changed = 1; }
        } else if (is_ref) new_active = 0;
        for (int r = 0; r < R; ++r) {
            const int tick = next_tick[r] == t, dn = is_ref && ref_rank == r;
            if (tick) {
                next_tick[r] += tREFI;
                changed = 1;
                if (!dn && owed[r] != maxp + 1) ++owed[r];
            } else if (dn) --owed[r];
        }
        ref_active = new_active;
        if (sel_col >= 0) { rank_q[rank_l[jsel]] -= 1; wq -= wr_l[jsel]; }
        int room = nxt < n && qn + (sel_col >= 0) < Q && wq + ws_n < Q;
        if (room && fe_on) {
            i64 pc;
            if (!fe_present(&fe, nxt, &pc) || pc > t) {
                room = 0;
                if (fe_present(&fe, nxt, &pc) && pc < wake) wake = pc;
            }
        }
        if (room) {
            if (fe_on) fe.A[nxt] = t;
            queue[qn++] = nxt;
            rank_q[rank_l[nxt]] += 1;
            wq += wr_l[nxt];
            ++nxt;
            changed = 1;
        }
        if (changed) ++t;
        else {
            i64 w = wake;
            for (int r = 0; r < R; ++r) if (next_tick[r] < w) w = next_tick[r];
            if (rd_n && !credit && rd_out[rd_h] < w) w = rd_out[rd_h];
            if (ws_n && nxt < n && wslot[ws_h] < w) w = wslot[ws_h];
            t = mx(t + 1, w);
        }
    }
    if (fe_on) {
        if (fe.nr == 0) {
            i64 m = 0;
            for (int k = 0; k < fe.ne; ++k) m = mx(m, fe.last_col[k]);
            out[0] = m + 1;
        } else {
            i64 p;
            if (!fe_pop(&fe, fe.nr - 1, &p)) { rc = -4; goto done; }
            out[0] = p + 2;
        }
    } else {
        i64 last = -1, lastw = 0;
        for (int j = 0; j < n; ++j) { if (!wr_l[j]) last = mx(last, col[j]); lastw = mx(lastw, col[j]); }
        out[0] = (last >= 0 ? last : lastw) + CL + BC + 2;
    }
    out[1] = acts; out[2] = pres; out[3] = refs;
    rc = 0;
done:
    free(b_open); free(b_row); free(b_act); free(b_col); free(b_pre); free(g_ccd); free(g_rrd); free(g_wtr);
    free(r_ccd); free(r_rrd); free(r_wtr); free(r_rdbus); free(r_wrbus); free(r_faw); free(r_fawp); free(rank_q);
    free(next_tick); free(owed); free(seen_b);
    free(fe.G); free(fe.C); free(fe.A); free(fe.last_col); free(fe.resp); free(fe.pops); free(fe.left);
    free(fe.rd_pos); free(fe.rd_order); free(fe.e_rd);
    return rc;
}
