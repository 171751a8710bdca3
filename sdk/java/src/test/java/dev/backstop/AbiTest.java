package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The module contract: the ABI version check, the exports required, the imports granted. */
class AbiTest {
  /**
   * A hand-assembled module exporting memory, _initialize and (unless
   * version is null) abi_version() returning version, optionally importing
   * one function: a foreign module as the loader sees it.
   */
  static byte[] tinyModule(Integer version, String importName) {
    ByteArrayOutputStream m = new ByteArrayOutputStream();
    m.writeBytes(new byte[] {0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00});
    section(m, 1, bytes(2, 0x60, 0, 0, 0x60, 0, 1, 0x7f)); // types: () -> (), () -> i32
    int imported = 0;
    if (importName != null) {
      ByteArrayOutputStream imp = new ByteArrayOutputStream();
      imp.write(1);
      str(imp, "env");
      str(imp, importName);
      imp.writeBytes(bytes(0, 0)); // a function of type 0
      section(m, 2, imp.toByteArray());
      imported = 1;
    }
    section(m, 3, bytes(2, 0, 1)); // functions: _initialize, abi_version
    section(m, 5, bytes(1, 0, 1)); // memory: 1 page
    List<byte[]> exports = new ArrayList<>();
    exports.add(export("memory", 2, 0));
    exports.add(export("_initialize", 0, imported));
    if (version != null) exports.add(export("abi_version", 0, imported + 1));
    ByteArrayOutputStream ex = new ByteArrayOutputStream();
    ex.write(exports.size());
    exports.forEach(ex::writeBytes);
    section(m, 7, ex.toByteArray());
    section(m, 10, bytes(2, 2, 0, 0x0b, 4, 0, 0x41, version == null ? 0 : version, 0x0b)); // nop; i32.const version
    return m.toByteArray();
  }

  private static byte[] bytes(int... b) {
    byte[] out = new byte[b.length];
    for (int i = 0; i < b.length; i++) out[i] = (byte) b[i];
    return out;
  }

  private static void str(ByteArrayOutputStream out, String s) {
    byte[] b = s.getBytes(StandardCharsets.UTF_8);
    out.write(b.length);
    out.writeBytes(b);
  }

  private static byte[] export(String name, int kind, int index) {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    str(out, name);
    out.write(kind);
    out.write(index);
    return out.toByteArray();
  }

  private static void section(ByteArrayOutputStream m, int id, byte[] body) {
    m.write(id);
    m.write(body.length);
    m.writeBytes(body);
  }

  private static String refusal(byte[] wasm) {
    return assertThrows(BackstopException.class, () -> PolicyRuntime.builder().wasm(wasm).build()).getMessage();
  }

  @Test
  void anUnknownAbiVersionIsRefused() {
    assertEquals("backstop.wasm: ABI version 2 is not supported: this backstop-policy implements ABI version 1;"
        + " use the module built for it", refusal(tinyModule(2, null)));
    assertTrue(refusal(tinyModule(null, null)).contains("has no abi_version export"));
    // Version 1 passes the check, but the module lacks the other exports.
    assertTrue(refusal(tinyModule(1, null)).contains("has no buffer export, which ABI version 1 requires"));
  }

  @Test
  void anImportBeyondTheGoRuntimeIsNotGranted() {
    String msg = refusal(tinyModule(1, "open_file"));
    assertTrue(msg.contains("imports env.open_file, which this host does not grant"), msg);
  }

  @Test
  void theBundledModuleGetsEveryImportItNeeds() {
    try (PolicyRuntime rt = PolicyRuntime.builder().maxInstances(1).build();
        Policy p = rt.preset("critical")) {
      assertEquals(50, p.decide(Failure.builder().attempt(1).httpStatus(503).random(0.5).nowMs(0).build()).delayMs());
    }
  }

  /** The imports of backstop.wasm are the ten wasm/ABI.md lists, all granted here; a new one needs a review. */
  @Test
  void theBundledModuleImportsOnlyWhatTheGoRuntimeNeeds() {
    var imports = com.dylibso.chicory.wasm.Parser.parse(PolicyRuntime.bundledWasm()).importSection();
    java.util.Set<String> got = new java.util.TreeSet<>();
    for (int i = 0; i < imports.importCount(); i++) {
      assertEquals(VirtualWasi.MODULE, imports.getImport(i).module());
      got.add(imports.getImport(i).name());
    }
    assertEquals(new java.util.TreeSet<>(List.of("args_get", "args_sizes_get", "clock_time_get", "environ_get",
        "environ_sizes_get", "fd_write", "poll_oneoff", "proc_exit", "random_get", "sched_yield")), got);
  }

  @Test
  void theModuleIsBundledInTheJar() {
    byte[] wasm = PolicyRuntime.bundledWasm();
    assertEquals(0x6d736100, (wasm[0] & 0xff) | (wasm[1] & 0xff) << 8 | (wasm[2] & 0xff) << 16 | (wasm[3] & 0xff) << 24);
    assertTrue(PolicyRuntime.resource("errorkinds.json").length > 100);
  }
}
