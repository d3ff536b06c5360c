// The JSON-schema matcher and the token constraint. Validity is judged by nlohmann's parser (the
// reference for "parses") plus the schema's stated rules.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "server/api_error.h"
#include "server/json_grammar.h"
#include "server/json_schema_constraint.h"

namespace tokenmill::server {
namespace {

using json = nlohmann::ordered_json;

const json kPerson = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bc"]}, "maxItems": 2},
    "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    "ok": {"type": "boolean"}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})");

TEST(JsonSchemaMatcher, AcceptsValidDocuments) {
  for (const char* doc :
       {R"({"name": "x", "age": 3})", R"({"age": -10, "name": "q\"\u00e9", "tags": ["a", "bc"]})",
        R"({ "name" : "x" , "age" : 0 , "score" : null , "ok" : true })",
        R"({"name": "x", "age": 3, "score": -1.5e+3})"}) {
    ASSERT_NO_THROW(json::parse(doc)) << doc;  // the reference agrees it parses
    EXPECT_TRUE(json_schema_accepts(kPerson, false, doc, true)) << doc;
  }
}

TEST(JsonSchemaMatcher, RejectsInvalidDocuments) {
  for (const char* doc : {R"({"name": "x"})",                           // missing required age
                          R"({"name": "x", "age": 3.5})",               // not an integer
                          R"({"name": "x", "age": 3, "zz": 1})",        // additional key
                          R"({"name": "x", "age": 3, "tags": ["b"]})",  // not in enum
                          R"({"name": "x", "age": 3, "tags": ["a", "a", "a"]})",  // maxItems
                          R"({"name": "x", "name": "y", "age": 1})",              // duplicate key
                          R"({"name": 5, "age": 1})", R"([1])", R"({"name": "x", "age": 01})",
                          R"({"name": "x", "age": 1,})"}) {
    EXPECT_FALSE(json_schema_accepts(kPerson, false, doc, true)) << doc;
  }
  // Valid prefixes are accepted as incomplete, not as complete.
  EXPECT_TRUE(json_schema_accepts(kPerson, false, R"({"name": "x", "ag)", false));
  EXPECT_FALSE(json_schema_accepts(kPerson, false, R"({"name": "x", "ag)", true));
  EXPECT_FALSE(json_schema_accepts(kPerson, false, R"({"nam": )", false));
}

// Strings stay valid UTF-8 with valid UTF-16 escapes, so a strict parser accepts every document
// the grammar completes (found by tests/fuzz/fuzz_json_schema.cpp: invalid bytes inside a string
// were accepted).
TEST(JsonSchemaMatcher, StringsAreValidUtf8AndUtf16) {
  const json str = json::parse(R"({"type": "string"})");
  for (const std::string& doc :
       {std::string("\"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf\""),
        std::string(R"("\ud83d\ude00 \uD7FF \ue000 \u00e9")")}) {
    ASSERT_NO_THROW(json::parse(doc)) << doc;
    EXPECT_TRUE(json_schema_accepts(str, false, doc, true)) << doc;
  }
  for (const std::string& doc : {
           std::string("\"\x80\""),              // a continuation byte with no lead
           std::string("\"\xc0\x80\""),          // overlong NUL
           std::string("\"\xe0\x80\x80\""),      // overlong 3-byte form
           std::string("\"\xed\xa0\x80\""),      // a UTF-16 surrogate in UTF-8
           std::string("\"\xf4\x90\x80\x80\""),  // past U+10FFFF
           std::string("\"\xf5\x80\x80\x80\""),  // not a lead byte
           std::string("\"\xc3\""),              // a character cut by the closing quote
           std::string("\"\xc3\xc3\""),          // a lead byte where a continuation belongs
           std::string(R"("\ud800")"),           // a lone high surrogate
           std::string(R"("\udc00")"),           // a lone low surrogate
           std::string(R"("\ud800\u0041")"),     // a high surrogate, then no low one
       }) {
    EXPECT_ANY_THROW(json::parse(doc)) << doc;  // the reference refuses it too
    EXPECT_FALSE(json_schema_accepts(str, false, doc, true)) << doc;
  }
  // A character may be cut between tokens: its first bytes are a valid prefix.
  EXPECT_TRUE(json_schema_accepts(str, false, "\"\xe4\xb8", false));
  EXPECT_TRUE(json_schema_accepts(str, false, R"("\ud83d\u)", false));
}

// A $ref cycle with no value in between has no finite document; the matcher expanded it until
// its stack overflowed (found by tests/fuzz/fuzz_json_schema.cpp). Now a 400; a cycle through an
// object or array is still fine.
TEST(JsonSchemaMatcher, RefCyclesWithoutAValueAre400) {
  for (
      const char* schema : {
          R"({"$ref": "#"})",
          R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
          R"({"$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}},
               "$ref": "#/$defs/a"})",
      }) {
    try {
      json_schema_accepts(json::parse(schema), false, "null", true);
      ADD_FAILURE() << "accepted " << schema;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find("leads back to itself"), std::string::npos) << e.what();
    }
  }
  const json list = json::parse(R"({"$defs": {"l": {"anyOf": [{"type": "null"},
      {"type": "object", "properties": {"next": {"$ref": "#/$defs/l"}}}]}}, "$ref": "#/$defs/l"})");
  EXPECT_TRUE(json_schema_accepts(list, false, R"({"next": {"next": null}})", true));
}

// Alternatives cannot make a byte cost exponential time: nested anyOf collapse into their
// distinct leaves (a 1.3 KB chain of 20 anyOf pairs had every byte expand 2^20 options), and
// parses that stay apart (arrays of alternatives in arrays of alternatives: 2^depth of them, a
// 4.6 KB schema took 20 s for 47 bytes) are kept to kMaxParses, each one still a valid parse.
TEST(JsonSchemaMatcher, AlternativesStayBounded) {
  using json_grammar::build_grammar;
  using json_grammar::kMaxParses;
  using json_grammar::Matcher;
  json chain = {{"$defs", {{"a0", {{"type", "string"}}}}}};
  json nest = {{"$defs", {{"a0", {{"type", "string"}}}, {"b0", {{"enum", {"x", "hello"}}}}}}};
  for (int i = 1; i <= 20; ++i) {
    const std::string p = std::to_string(i - 1), a = "a" + std::to_string(i);
    const json ra = {{"$ref", "#/$defs/a" + p}}, rb = {{"$ref", "#/$defs/b" + p}};
    chain["$defs"][a] = {{"anyOf", {ra, ra}}};
    const json arr_a = {{"type", "array"}, {"items", ra}},
               arr_b = {{"type", "array"}, {"items", rb}};
    nest["$defs"][a] = {{"anyOf", {arr_a, arr_b}}};
    nest["$defs"]["b" + std::to_string(i)] = {{"anyOf", {arr_b, arr_a}}};
  }
  chain["$ref"] = nest["$ref"] = "#/$defs/a20";
  auto g = build_grammar(chain, false);
  Matcher m(g->root);
  ASSERT_TRUE(m.feed("\"hel"));
  EXPECT_EQ(m.parses(), 1u);
  auto gn = build_grammar(nest, false);
  Matcher mn(gn->root);
  ASSERT_TRUE(mn.feed(std::string(20, '[')));
  EXPECT_EQ(mn.parses(), kMaxParses);  // 2^20 distinct parses, the first kMaxParses kept
  EXPECT_TRUE(json_schema_accepts(nest, false,
                                  std::string(20, '[') + "\"hello\"" + std::string(20, ']'), true));
}

TEST(JsonSchemaMatcher, JsonObjectModeAndRefs) {
  EXPECT_TRUE(json_schema_accepts(json(), true, R"({"a": [1, {"b": null}], "c": "d"})", true));
  EXPECT_FALSE(json_schema_accepts(json(), true, R"([1])", true));
  json tree = json::parse(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"], "additionalProperties": false}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(
      json_schema_accepts(tree, false, R"({"v": 1, "kids": [{"v": 2, "kids": []}]})", true));
  EXPECT_FALSE(json_schema_accepts(tree, false, R"({"v": 1, "kids": [{"w": 2}]})", true));
  json consts = json::parse(R"({"enum": ["x", 5, null, {"a": 1}]})");
  EXPECT_TRUE(json_schema_accepts(consts, false, R"({"a":1})", true));
  EXPECT_TRUE(json_schema_accepts(consts, false, R"("x")", true));
  EXPECT_FALSE(json_schema_accepts(consts, false, R"("y")", true));
}

TEST(JsonSchemaMatcher, NumbersAreBoundedSoTheyStayIntegers) {
  json integer = json::parse(R"({"type": "integer"})");
  json number = json::parse(R"({"type": "number"})");
  const std::string d18(18, '9'), d20(20, '9');
  // 18 digits always fit int64, so the reference parser keeps the value an integer.
  ASSERT_TRUE(json::parse(d18).is_number_integer());
  ASSERT_TRUE(json::parse("-" + d18).is_number_integer());
  EXPECT_TRUE(json_schema_accepts(integer, false, d18, true));
  EXPECT_TRUE(json_schema_accepts(integer, false, "-" + d18, true));
  EXPECT_FALSE(json_schema_accepts(integer, false, d18 + "9", false));
  EXPECT_TRUE(json_schema_accepts(number, false, d20, true));
  EXPECT_TRUE(json_schema_accepts(number, false, "1." + std::string(19, '5'), true));
  EXPECT_FALSE(json_schema_accepts(number, false, d20 + "9", false));
}

TEST(JsonSchemaMatcher, UnsupportedKeywordsAre400) {
  try {
    validate_json_schema(json::parse(R"({"type": "string", "pattern": "^a$"})"));
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), "response_format.json_schema.schema");
    EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos);
  }
  EXPECT_THROW(validate_json_schema(json::parse(R"({"$ref": "#/$defs/missing"})")), ApiError);
  EXPECT_THROW(validate_json_schema(json::parse(R"({"type": "objekt"})")), ApiError);
}

// A random walk through a toy vocabulary under the mask always produces a document that parses
// and satisfies the schema, and stops only when it is complete.
TEST(JsonConstraint, RandomMaskedWalksProduceValidDocuments) {
  std::vector<std::string> vocab = {"{",     "}",  "\"", "name", "age",   ":",    ",",    " ",
                                    "1",     "0",  "-",  ".",    "e",     "x",    "\":",  "[",
                                    "]",     "a",  "bc", "tags", "\"a\"", "null", "true", "ok",
                                    "score", "\\", "n",  "\"}",  "2.5",   "</s>", "\n"};
  // Like real byte-level vocabularies, every single letter is a token too (so no prefix the
  // mask allows is a dead end).
  for (char ch = 'a'; ch <= 'z'; ++ch) vocab.push_back(std::string(1, ch));
  auto bytes = std::make_shared<std::vector<std::string>>(vocab);
  std::vector<uint8_t> special(vocab.size(), 0);
  const int32_t eos = 29;
  special[eos] = 1;
  std::mt19937 rng(1234);
  int finished = 0;
  for (int walk = 0; walk < 300; ++walk) {
    auto c = make_json_constraint(bytes, special, {eos}, kPerson, false);
    std::string text;
    bool done = false;
    for (int step = 0; step < 200 && !done; ++step) {
      std::vector<uint8_t> allowed(vocab.size(), 1);
      c->mask(allowed);
      std::vector<int32_t> ok;
      for (size_t i = 0; i < allowed.size(); ++i) {
        if (allowed[i]) ok.push_back(int32_t(i));
      }
      ASSERT_FALSE(ok.empty()) << "dead end after [" << text << "] step " << step;
      int32_t t = ok[rng() % ok.size()];
      if (t == eos) {
        done = true;
        break;
      }
      text += vocab[t];
      done = !c->accept(t);
    }
    if (!done) continue;
    ++finished;
    json parsed;
    ASSERT_NO_THROW(parsed = json::parse(text)) << text;
    EXPECT_TRUE(parsed.contains("name") && parsed["name"].is_string()) << text;
    EXPECT_TRUE(parsed.contains("age") && parsed["age"].is_number_integer()) << text;
    for (auto it = parsed.begin(); it != parsed.end(); ++it) {
      EXPECT_TRUE(kPerson["properties"].contains(it.key())) << text;
    }
  }
  EXPECT_GT(finished, 20);
}

}  // namespace
}  // namespace tokenmill::server
