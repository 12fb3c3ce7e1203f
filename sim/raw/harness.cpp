// The nano-KPU's Verilator model driven from C++ alone: no Python, no VPI, per cycle.
//
// Built and run by sim/lib/raw_run.py (Verilator --cc --exe, top module kpu_<profile>, prefix Vtop,
// the Verilog of the cocotb build). It replays a script the cocotb bench recorded
// (sim/lib/kpu_tb.py TB.transcript, written by raw_run.write_replay), one command a line:
//
//   image PATH                         host memory from byte 0 (the rest zero; 16 MiB, addresses modulo)
//   reset HIGH LOW                     rst high for HIGH cycles, then low for LOW cycles
//   write ADDR VALUE                   an AXI4-Lite write (all byte strobes)
//   read ADDR                          an AXI4-Lite read; prints "read ADDR VALUE"
//   run CTRL WORD STATUS MASK POLL LIMIT
//                                      write WORD to CTRL (the start), then read STATUS until
//                                      STATUS & MASK is 0, waiting POLL cycles (or until irq rises)
//                                      between reads; prints "run CLOCKS SECONDS STATUS BEATS": the
//                                      clock cycles and the wall time of this phase alone, the last
//                                      STATUS and the AXI4 data beats (read and written) in it;
//                                      fails after LIMIT
//   dump PATH LENGTH                   host memory [0, LENGTH) to PATH
//
// Numbers are C literals (0x... or decimal). Any error (bad script, protocol violation, timeout)
// prints "error ..." on stderr and exits with status 1.
//
// The AXI4 slave on m_axi is cycle for cycle cocotbext-axi 0.1.28's AxiRam without pauses (the
// bench's run with pause 0): each channel is a cocotbext-axi stream sink or source (queue limit 2,
// ready = queue not full, updated at each rising edge after sampling), and the read and write
// processes take bursts from the address queues and feed the data/response queues after the edge
// tasks of the same edge. So the KPU sees the same ready/valid sequence and counts the same
// cycles as under cocotb. The AXI4-Lite master is plain (address and data together, one
// transaction at a time): its timing only moves the host's polls, not the KPU's CYCLES.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "Vtop.h"
#include "verilated.h"

namespace {

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "error %s\n", what.c_str());
    std::exit(1);
}

constexpr uint64_t kMemSize = 1u << 24;  // the bench's AxiRam(size=1 << 24)

struct Burst {
    uint64_t addr;
    unsigned beats;
    unsigned size;
    unsigned burst;
    unsigned id;
};

struct RBeat {
    uint64_t data;
    bool last;
    unsigned id;
};

struct WBeat {
    uint64_t data;
    unsigned strb;
    bool last;
};

// What the model samples at a rising edge: the design's outputs as settled before the edge.
struct Sample {
    bool arvalid, rready, awvalid, wvalid, bready;
    Burst ar, aw;
    WBeat w;
    bool l_awready, l_wready, l_bvalid, l_arready, l_rvalid;
    uint32_t l_rdata;
    bool irq;
};

class Harness {
   public:
    explicit Harness(std::unique_ptr<Vtop> top) : top_(std::move(top)), mem_(kMemSize, 0) {
        lanes_ = sizeof(top_->m_axi___05Frdata);
        drive();
        top_->clk = 0;
        top_->eval();
    }

    void image(const std::string& path) {
        std::ifstream f(path, std::ios::binary);
        if (!f) fail("cannot read " + path);
        std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        if (bytes.size() > kMemSize) fail("image larger than the host memory");
        std::fill(mem_.begin(), mem_.end(), 0);
        std::copy(bytes.begin(), bytes.end(), mem_.begin());
    }

    void dump(const std::string& path, uint64_t length) {
        if (length > kMemSize) fail("dump beyond the host memory");
        std::ofstream f(path, std::ios::binary);
        f.write(reinterpret_cast<const char*>(mem_.data()), static_cast<std::streamsize>(length));
        if (!f) fail("cannot write " + path);
    }

    void reset(uint64_t high, uint64_t low) {
        rst_ = true;
        apply();
        for (uint64_t i = 0; i < high; ++i) tick();
        rst_ = false;
        apply();
        for (uint64_t i = 0; i < low; ++i) tick();
    }

    void write(uint32_t addr, uint32_t value) {
        l_awaddr_ = addr;
        l_wdata_ = value;
        l_awvalid_ = l_wvalid_ = true;
        l_b_ = false;
        apply();
        for (uint64_t i = 0; l_awvalid_ || l_wvalid_ || !l_b_; ++i) {
            if (i > kLiteTimeout) fail("AXI4-Lite write without a response");
            tick();
        }
    }

    uint32_t read(uint32_t addr) {
        l_araddr_ = addr;
        l_arvalid_ = true;
        l_r_ = false;
        apply();
        for (uint64_t i = 0; l_arvalid_ || !l_r_; ++i) {
            if (i > kLiteTimeout) fail("AXI4-Lite read without data");
            tick();
        }
        return l_rdata_;
    }

    // The run phase: start, then poll; returns the last STATUS.
    uint32_t run(uint32_t ctrl, uint32_t word, uint32_t status_addr, uint32_t mask, uint64_t poll,
                 uint64_t limit) {
        uint64_t start = clocks_;
        write(ctrl, word);
        while (true) {
            uint32_t status = read(status_addr);
            if (!(status & mask)) return status;
            for (uint64_t i = 0; i < poll && !irq_rose_; ++i) tick();
            irq_rose_ = false;
            if (clocks_ - start > limit) fail("no stop within the cycle limit");
        }
    }

    uint64_t clocks() const { return clocks_; }
    uint64_t beats() const { return beats_; }

   private:
    static constexpr uint64_t kLiteTimeout = 100000;

    // Drive what the host chose between two edges (after the last one), as cocotb's writes do.
    void apply() {
        drive();
        top_->eval();
    }

    // One clock cycle: sample, the bus models' edge, the design's edge (with the inputs driven
    // before it), then the inputs the models chose at this edge, applied with the falling edge.
    void tick() {
        Sample s = sample();
        if (rst_) {
            slave_reset();
        } else {
            slave_edge(s);
        }
        lite_edge(s);
        irq_rose_ = irq_rose_ || (s.irq && !irq_last_);
        irq_last_ = s.irq;
        top_->clk = 1;
        top_->eval();
        drive();  // with the falling edge: the design has no logic on it
        top_->clk = 0;
        top_->eval();
        ++clocks_;
    }

    Sample sample() const {
        Sample s{};
        s.arvalid = top_->m_axi___05Farvalid;
        s.ar = {top_->m_axi___05Faraddr, top_->m_axi___05Farlen + 1u, top_->m_axi___05Farsize,
                top_->m_axi___05Farburst, top_->m_axi___05Farid};
        s.rready = top_->m_axi___05Frready;
        s.awvalid = top_->m_axi___05Fawvalid;
        s.aw = {top_->m_axi___05Fawaddr, top_->m_axi___05Fawlen + 1u, top_->m_axi___05Fawsize,
                top_->m_axi___05Fawburst, top_->m_axi___05Fawid};
        s.wvalid = top_->m_axi___05Fwvalid;
        s.w = {top_->m_axi___05Fwdata, top_->m_axi___05Fwstrb, static_cast<bool>(top_->m_axi___05Fwlast)};
        s.bready = top_->m_axi___05Fbready;
        s.l_awready = top_->s_axil___05Fawready;
        s.l_wready = top_->s_axil___05Fwready;
        s.l_bvalid = top_->s_axil___05Fbvalid;
        s.l_arready = top_->s_axil___05Farready;
        s.l_rvalid = top_->s_axil___05Frvalid;
        s.l_rdata = top_->s_axil___05Frdata;
        s.irq = top_->irq;
        return s;
    }

    void drive() {
        top_->rst = rst_;
        top_->m_axi___05Farready = arready_;
        top_->m_axi___05Frvalid = rvalid_;
        top_->m_axi___05Frdata = r_.data;
        top_->m_axi___05Frlast = r_.last;
        top_->m_axi___05Frid = r_.id;
        top_->m_axi___05Frresp = 0;
        top_->m_axi___05Fawready = awready_;
        top_->m_axi___05Fwready = wready_;
        top_->m_axi___05Fbvalid = bvalid_;
        top_->m_axi___05Fbid = b_id_;
        top_->m_axi___05Fbresp = 0;
        top_->s_axil___05Fawaddr = l_awaddr_;
        top_->s_axil___05Fawprot = 0;
        top_->s_axil___05Fawvalid = l_awvalid_;
        top_->s_axil___05Fwdata = l_wdata_;
        top_->s_axil___05Fwstrb = 0xF;
        top_->s_axil___05Fwvalid = l_wvalid_;
        top_->s_axil___05Fbready = 1;
        top_->s_axil___05Faraddr = l_araddr_;
        top_->s_axil___05Farprot = 0;
        top_->s_axil___05Farvalid = l_arvalid_;
        top_->s_axil___05Frready = 1;
    }

    void slave_reset() {
        arq_.clear();
        rq_.clear();
        awq_.clear();
        wq_.clear();
        bq_.clear();
        reading_ = writing_ = false;
        arready_ = rvalid_ = awready_ = wready_ = bvalid_ = false;
    }

    // cocotbext-axi's edge tasks (sinks, sources), then its read and write processes.
    void slave_edge(const Sample& s) {
        beats_ += (s.rready && rvalid_) + (wready_ && s.wvalid);
        if (arready_ && s.arvalid) arq_.push_back(s.ar);
        arready_ = arq_.size() < 2;
        if ((s.rready && rvalid_) || !rvalid_) {
            rvalid_ = !rq_.empty();
            if (rvalid_) {
                r_ = rq_.front();
                rq_.pop_front();
            }
        }
        if (awready_ && s.awvalid) awq_.push_back(s.aw);
        awready_ = awq_.size() < 2;
        if (wready_ && s.wvalid) wq_.push_back(s.w);
        wready_ = wq_.size() < 2;
        if ((s.bready && bvalid_) || !bvalid_) {
            bvalid_ = !bq_.empty();
            if (bvalid_) {
                b_id_ = bq_.front();
                bq_.pop_front();
            }
        }
        process_read();
        process_write();
    }

    // The first beat's word address and the step per beat of a burst (INCR or FIXED).
    uint64_t start(const Burst& b, const char* dir) const {
        uint64_t bytes = 1ull << b.size;
        if (bytes > lanes_) fail(std::string(dir) + " burst wider than the bus");
        if (b.burst > 1) fail(std::string(dir) + " WRAP burst: not modelled");
        uint64_t aligned = b.addr / bytes * bytes;
        if (b.burst == 1 && 0x1000 - (aligned & 0xfff) < bytes * b.beats)
            fail(std::string(dir) + " burst crosses a 4 KB boundary");
        return aligned;
    }

    void process_read() {
        while (true) {
            if (!reading_) {
                if (arq_.empty()) return;
                rd_ = arq_.front();
                arq_.pop_front();
                rd_addr_ = start(rd_, "read");
                rd_n_ = 0;
                reading_ = true;
            }
            if (rq_.size() >= 2) return;
            uint64_t word = rd_addr_ / lanes_ * lanes_;
            uint64_t data = 0;
            for (unsigned i = 0; i < lanes_; ++i) data |= uint64_t(mem_[(word + i) % kMemSize]) << (8 * i);
            rq_.push_back({data, rd_n_ == rd_.beats - 1, rd_.id});
            if (rd_.burst == 1) rd_addr_ += 1ull << rd_.size;
            if (++rd_n_ == rd_.beats) reading_ = false;
        }
    }

    void process_write() {
        while (true) {
            if (!writing_) {
                if (awq_.empty()) return;
                wr_ = awq_.front();
                awq_.pop_front();
                wr_addr_ = start(wr_, "write");
                wr_n_ = 0;
                writing_ = true;
            }
            if (wr_n_ == wr_.beats) {  // all beats in: the response
                if (bq_.size() >= 2) return;
                bq_.push_back(wr_.id);
                writing_ = false;
                continue;
            }
            if (wq_.empty()) return;
            WBeat w = wq_.front();
            wq_.pop_front();
            uint64_t word = wr_addr_ / lanes_ * lanes_;
            for (unsigned i = 0; i < lanes_; ++i)
                if (w.strb >> i & 1) mem_[(word + i) % kMemSize] = uint8_t(w.data >> (8 * i));
            if (w.last != (wr_n_ == wr_.beats - 1)) fail("WLAST out of place");
            if (wr_.burst == 1) wr_addr_ += 1ull << wr_.size;
            ++wr_n_;
        }
    }

    void lite_edge(const Sample& s) {
        if (l_awvalid_ && s.l_awready) l_awvalid_ = false;
        if (l_wvalid_ && s.l_wready) l_wvalid_ = false;
        if (s.l_bvalid) l_b_ = true;
        if (l_arvalid_ && s.l_arready) l_arvalid_ = false;
        if (s.l_rvalid) {
            l_r_ = true;
            l_rdata_ = s.l_rdata;
        }
    }

    std::unique_ptr<Vtop> top_;
    std::vector<uint8_t> mem_;
    unsigned lanes_;
    uint64_t clocks_ = 0, beats_ = 0;
    bool rst_ = false;
    bool irq_last_ = false, irq_rose_ = false;
    // AXI4 slave: driven values, queues, the processes' bursts
    bool arready_ = false, rvalid_ = false, awready_ = false, wready_ = false, bvalid_ = false;
    RBeat r_{};
    unsigned b_id_ = 0;
    std::deque<Burst> arq_, awq_;
    std::deque<RBeat> rq_;
    std::deque<WBeat> wq_;
    std::deque<unsigned> bq_;
    bool reading_ = false, writing_ = false;
    Burst rd_{}, wr_{};
    uint64_t rd_addr_ = 0, wr_addr_ = 0;
    unsigned rd_n_ = 0, wr_n_ = 0;
    // AXI4-Lite master
    uint32_t l_awaddr_ = 0, l_wdata_ = 0, l_araddr_ = 0, l_rdata_ = 0;
    bool l_awvalid_ = false, l_wvalid_ = false, l_arvalid_ = false, l_b_ = false, l_r_ = false;
};

uint64_t number(std::istringstream& in, const std::string& line) {
    std::string token;
    if (!(in >> token)) fail("missing number in: " + line);
    char* end = nullptr;
    uint64_t value = std::strtoull(token.c_str(), &end, 0);
    if (*end) fail("bad number '" + token + "' in: " + line);
    return value;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) fail("usage: harness SCRIPT");
    auto context = std::make_unique<VerilatedContext>();
    Harness h(std::make_unique<Vtop>(context.get()));
    std::ifstream script(argv[1]);
    if (!script) fail(std::string("cannot read ") + argv[1]);
    std::string line;
    while (std::getline(script, line)) {
        std::istringstream in(line);
        std::string cmd;
        if (!(in >> cmd)) continue;
        if (cmd == "image") {
            std::string path;
            in >> path;
            h.image(path);
        } else if (cmd == "reset") {
            uint64_t high = number(in, line);
            h.reset(high, number(in, line));
        } else if (cmd == "write") {
            uint64_t addr = number(in, line);
            h.write(uint32_t(addr), uint32_t(number(in, line)));
        } else if (cmd == "read") {
            uint64_t addr = number(in, line);
            std::printf("read %#llx %#x\n", (unsigned long long)addr, h.read(uint32_t(addr)));
        } else if (cmd == "run") {
            uint32_t ctrl = uint32_t(number(in, line)), word = uint32_t(number(in, line));
            uint32_t status = uint32_t(number(in, line)), mask = uint32_t(number(in, line));
            uint64_t poll = number(in, line), limit = number(in, line);
            uint64_t clocks = h.clocks(), beats = h.beats();
            auto t0 = std::chrono::steady_clock::now();
            uint32_t last = h.run(ctrl, word, status, mask, poll, limit);
            std::chrono::duration<double> wall = std::chrono::steady_clock::now() - t0;
            std::printf("run %llu %.6f %#x %llu\n", (unsigned long long)(h.clocks() - clocks), wall.count(), last,
                        (unsigned long long)(h.beats() - beats));
        } else if (cmd == "dump") {
            std::string path;
            in >> path;
            h.dump(path, number(in, line));
        } else {
            fail("unknown command: " + line);
        }
    }
    return 0;
}
