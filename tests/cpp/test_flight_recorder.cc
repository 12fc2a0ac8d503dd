// torch's flight recorder dump as the watchdog reads it: the JSON reader's limits and the dump's parts.
#include <gtest/gtest.h>

#include "gpuguard/flight_recorder.h"
#include "gpuguard/json_value.h"

namespace {

// What torch 2.15's dump_fr_trace_json wrote for two gloo ranks, one collective still waiting (abridged: the
// fields gpuguard reads, and some it does not).
const char* kDump = R"({"comm_lib_version":"","entries":[
 {"collective_seq_id":1,"input_dtypes":["Float"],"input_sizes":[[4]],"is_p2p":false,"op_id":1,"output_dtypes":["Float"],
  "output_sizes":[[4]],"p2p_seq_id":0,"pg_id":0,"process_group":["0","default_pg"],"profiling_name":"gloo:all_reduce",
  "record_id":0,"retired":true,"state":"scheduled","thread_id":"140493283761024","thread_name":"python3",
  "time_created_ns":1795529047835970399,"time_discovered_completed_ns":0,"time_discovered_started_ns":0,"timeout_ms":1800000},
 {"collective_seq_id":2,"input_dtypes":["BFloat16","BFloat16"],"input_sizes":[[2,3],[2,3]],"is_p2p":false,"op_id":2,
  "process_group":["0","default_pg"],"profiling_name":"nccl:all_gather","retired":false,"state":"started",
  "thread_id":"140493283761024","thread_name":"pt_autograd_0","time_created_ns":1795529047837254552}],
 "nccl_comm_state":{},"pg_config":{"":{"desc":"","name":"","ranks":"[0, 1]"}},
 "pg_status":{"0":{"last_completed_collective":"1","last_enqueued_collective":"2","last_started_collective":"-1"}},
 "version":"2.10"})";

}  // namespace

TEST(JsonValue, ReadsWhatTorchWritesAndKeeps64BitIntegers) {
  auto v = gpuguard::parse_json(R"({"a": [1, -2.5e3, "x\u00e9\ud83d\ude00", true, null], "n": 1795529047835970399})");
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(*v.value().find("n")->as_int(), 1795529047835970399LL);
  EXPECT_EQ(v.value().find("a")->items[2].text, "x\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_FALSE(v.value().find("a")->items[1].as_int());  // a fraction is no integer
}

TEST(JsonValue, RefusesMalformedTextAndNamesWhere) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "\"\\q\"", "tru", "[1] 2", "\"a\nb\""}) {
    auto v = gpuguard::parse_json(bad);
    EXPECT_FALSE(v) << bad;
    if (!v) {
      EXPECT_NE(v.error().message().find("at offset"), std::string::npos) << v.error().message();
    }
  }
  EXPECT_FALSE(gpuguard::parse_json(std::string(100, '[') + std::string(100, ']')));  // deeper than the limit
  EXPECT_FALSE(gpuguard::parse_json("[1]", {2, 64}));                                 // longer than the limit
}

TEST(FlightRecorderDump, GivesEachGroupsStatusAndItsCollectives) {
  auto dump = gpuguard::parse_flight_recorder_dump(kDump);
  ASSERT_TRUE(dump) << dump.error().message();
  ASSERT_EQ(dump.value().groups.size(), 1u);
  const auto& g = dump.value().groups[0];
  EXPECT_EQ(g.name, "0");
  EXPECT_EQ(g.enqueued, 2);  // torch writes these counters as strings in JSON, as numbers in its pickle
  EXPECT_EQ(g.completed, 1);
  EXPECT_EQ(g.started, -1);
  ASSERT_EQ(dump.value().collectives.size(), 2u);
  const auto& first = dump.value().collectives[0];
  EXPECT_EQ(first.op, "ALL_REDUCE");
  EXPECT_EQ(first.sizes, "float32[4]");
  EXPECT_EQ(first.desc, "default_pg");
  EXPECT_TRUE(first.retired);
  const auto& second = dump.value().collectives[1];
  EXPECT_EQ(second.op, "ALL_GATHER");
  EXPECT_EQ(second.sizes, "list[2] of bfloat16[6]");
  EXPECT_EQ(second.thread_name, "pt_autograd_0");
  EXPECT_EQ(second.created_ns, 1795529047837254552LL);
}

TEST(FlightRecorderDump, SizesThatOverflowAreNamedNotComputed) {
  EXPECT_EQ(gpuguard::describe_recorded_sizes({{1LL << 40, 1LL << 40}}, {"Float"}), "?[too large]");
  EXPECT_EQ(gpuguard::describe_recorded_sizes({{2, 3}}, {"Half"}), "float16[6]");
}

TEST(FlightRecorderDump, ATorchWithoutGroupStatusIsRefusedSayingSo) {
  auto dump = gpuguard::parse_flight_recorder_dump(R"({"version":"2.1","entries":[]})");
  ASSERT_FALSE(dump);
  EXPECT_NE(dump.error().message().find("it has no pg_status"), std::string::npos) << dump.error().message();
  EXPECT_FALSE(gpuguard::parse_flight_recorder_dump(R"({"pg_status":{"0":{"last_enqueued_collective":"x"}}})"));
  EXPECT_FALSE(gpuguard::parse_flight_recorder_dump(R"({"pg_status":{},"entries":[{"collective_seq_id":1}]})"));
}

TEST(FlightRecorderDump, TheCReaderIsCalledAndItsErrorsNamed) {
  gpuguard_flight_recorder_reader ok{gpuguard::kFlightRecorderReaderAbi,
                                     [](const char* source, int include, gpuguard_text_sink sink, void* ctx) {
                                       std::string out = std::string(source) + (include ? "+" : "-");
                                       sink(ctx, out.data(), out.size());
                                       return 0;
                                     }};
  auto read = gpuguard::flight_recorder_read(&ok);
  EXPECT_EQ(read("gloo", true).value(), "gloo+");
  gpuguard_flight_recorder_reader failing{gpuguard::kFlightRecorderReaderAbi,
                                          [](const char*, int, gpuguard_text_sink sink, void* ctx) {
                                            sink(ctx, "no recorder", 11);
                                            return 1;
                                          }};
  auto failed = gpuguard::flight_recorder_read(&failing)("nccl", false);
  ASSERT_FALSE(failed);
  EXPECT_NE(failed.error().message().find("no recorder"), std::string::npos);
  EXPECT_NE(failed.error().message().find("flight recorder (nccl)"), std::string::npos);
}
