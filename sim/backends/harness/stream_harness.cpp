// Verilator stream harness: runs one whole stream testbench (sim/backends/base.py protocol) in C++.
// Generated per design by sim/backends/verilator.py, which fills in the @...@ placeholders with one block
// per stream port of the wrapper module `harness_top` (ports inK_* / outK_*, clk; the wrapper drives the design's
// rst itself: high until the first clock edge).
//
// usage: sim STIMULUS RESULT [+plusarg ...]   (plusargs reach the design: $value$plusargs, $readmemh files)
// STIMULUS (little-endian): u64 max_cycles, u64 quiet_cycles; per input port: u64 n_items, u64 pat_len,
//   u8 pat[pat_len], u32 words[n_items * NWORDS]; per output port: u64 mode (0 not named, 1 count, 2 whole),
//   u64 n_expected, u64 pat_len, u8 pat[pat_len].
// RESULT: u64 status (0 done, 1 timeout), u64 cycles (to completion); per output port: u64 n_seen (every
//   payload handed over, quiet window included), u64 seen_at_done (at completion), u64 extra_cycle (cycle of
//   payload n_expected + 1 of a counted port, UINT64_MAX if none), u64 n_words, u32 words[n_words] (every
//   payload).
// After completion the protocol continues for quiet_cycles cycles (the check window of sim/backends/base.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "verilated.h"
#include "Vharness_top.h"

typedef std::vector<uint32_t> Words;

static void die(const char* msg) {
    std::fprintf(stderr, "stream harness: %s\n", msg);
    std::exit(2);
}

static inline void set_payload(CData& s, const uint32_t* w) { s = static_cast<CData>(w[0]); }
static inline void set_payload(SData& s, const uint32_t* w) { s = static_cast<SData>(w[0]); }
static inline void set_payload(IData& s, const uint32_t* w) { s = w[0]; }
static inline void set_payload(QData& s, const uint32_t* w) {
    s = static_cast<QData>(w[0]) | (static_cast<QData>(w[1]) << 32);
}
template <std::size_t N> static inline void set_payload(VlWide<N>& s, const uint32_t* w) {
    for (std::size_t i = 0; i < N; ++i) s[i] = w[i];
}

static inline void get_payload(CData s, Words& out) { out.push_back(s); }
static inline void get_payload(SData s, Words& out) { out.push_back(s); }
static inline void get_payload(IData s, Words& out) { out.push_back(s); }
static inline void get_payload(QData s, Words& out) {
    out.push_back(static_cast<uint32_t>(s));
    out.push_back(static_cast<uint32_t>(s >> 32));
}
template <std::size_t N> static inline void get_payload(const VlWide<N>& s, Words& out) {
    for (std::size_t i = 0; i < N; ++i) out.push_back(s[i]);
}

struct Reader {
    FILE* f;
    uint64_t u64() { uint64_t v; bytes(&v, sizeof v); return v; }
    void bytes(void* p, std::size_t n) { if (n && std::fread(p, 1, n, f) != n) die("stimulus file too short"); }
};

struct InPort {
    uint64_t n = 0, pos = 0;
    bool presenting = false;
    std::vector<uint8_t> pat;
    Words data;
    void read(Reader& r, std::size_t nwords) {
        n = r.u64();
        pat.resize(r.u64());
        if (pat.empty()) die("empty valid pattern");
        r.bytes(pat.data(), pat.size());
        data.resize(n * nwords);
        r.bytes(data.data(), data.size() * sizeof(uint32_t));
    }
};

struct OutPort {
    bool all = false;  // not waited for (not named, or collected whole)
    uint64_t want = 0, seen = 0, seen_at_done = 0, extra_cycle = UINT64_MAX;
    std::vector<uint8_t> pat;
    Words data;
    void read(Reader& r) {
        const uint64_t mode = r.u64();
        all = mode != 1;
        want = r.u64();
        if (all) want = UINT64_MAX;
        pat.resize(r.u64());
        if (pat.empty()) die("empty ready pattern");
        r.bytes(pat.data(), pat.size());
    }
};

int main(int argc, char** argv) {
    if (argc < 3) die("usage: sim STIMULUS RESULT [+plusarg ...]");
    const int n_in = @N_IN@, n_out = @N_OUT@;
    std::vector<InPort> ins(n_in > 0 ? n_in : 1);
    std::vector<OutPort> outs(n_out > 0 ? n_out : 1);
    FILE* fi = std::fopen(argv[1], "rb");
    if (!fi) die("cannot open stimulus file");
    Reader r{fi};
    const uint64_t max_cycles = r.u64();
    const uint64_t quiet_cycles = r.u64();
@READ@
    std::fclose(fi);

    const std::unique_ptr<VerilatedContext> context{new VerilatedContext};
    context->commandArgs(argc, argv);
    const std::unique_ptr<Vharness_top> top{new Vharness_top{context.get()}};
    // Reset: one clock edge with rst high (the wrapper's register) and every valid/ready low.
@IDLE@
    top->clk = 0; top->eval();
    top->clk = 1; top->eval();

    uint64_t t = 0, end = 0;
    bool done = false;  // even with nothing to collect, a run lasts at least one cycle
    while (done ? t < end : t < max_cycles) {
        top->clk = 0;
@DRIVE@
        top->eval();
@SAMPLE@
        top->clk = 1;
        top->eval();
        ++t;
        if (!done && (@DONE@)) {
            done = true;
            end = t + quiet_cycles;
            for (int k = 0; k < n_out; ++k) outs[k].seen_at_done = outs[k].seen;
        }
    }
    top->final();
    const uint64_t cycles = done ? end - quiet_cycles : t;

    FILE* fo = std::fopen(argv[2], "wb");
    if (!fo) die("cannot open result file");
    uint64_t head[2] = {done ? 0u : 1u, cycles};
    std::fwrite(head, sizeof head, 1, fo);
    for (int k = 0; k < n_out; ++k) {
        if (!done) outs[k].seen_at_done = outs[k].seen;
        uint64_t counts[4] = {outs[k].seen, outs[k].seen_at_done, outs[k].extra_cycle, outs[k].data.size()};
        std::fwrite(counts, sizeof counts, 1, fo);
        std::fwrite(outs[k].data.data(), sizeof(uint32_t), outs[k].data.size(), fo);
    }
    if (std::fclose(fo) != 0) die("cannot write result file");
    return 0;
}
