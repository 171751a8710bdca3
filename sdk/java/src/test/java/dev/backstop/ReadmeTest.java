package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.PrintStream;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The ```java blocks of the documentation run as written (issue 13, "Docs
 * that run"; internal/integration/docs checks that every other block is run by its own
 * suite): each block is the body of a method, compiled with javac against
 * this package and run. A "// prints: X" line says the statement before it
 * prints the line X; the block's output must be exactly those lines. A
 * block can only be left out with <!-- snippet: skip=why --> on the line
 * before its fence.
 */
class ReadmeTest {
  /** The documents whose ```java blocks run (internal/integration/docs: javaDocFiles holds the same list). */
  static final List<String> FILES = List.of("README.md", "sdk/java/README.md", "docs/idempotency.md");

  private static final Pattern FENCE = Pattern.compile("^```(\\S*)\\s*$");
  private static final Pattern MARKER = Pattern.compile("^<!--\\s*snippet:\\s*(.*?)\\s*-->$");
  private static final Pattern PRINTS = Pattern.compile("^\\s*// prints: (.*)$");

  private static final String IMPORTS = String.join("\n", "import dev.backstop.*;",
      "import io.prometheus.metrics.model.registry.PrometheusRegistry;", "import io.lettuce.core.RedisClient;", "import java.io.*;", "import java.net.*;",
      "import java.net.http.*;", "import java.time.*;", "import java.util.*;",
      "import java.util.concurrent.*;", "import java.util.concurrent.atomic.*;", "import java.nio.charset.StandardCharsets;",
      "import java.sql.Connection;", "import java.sql.PreparedStatement;", "import java.sql.ResultSet;", "import java.sql.Statement;",
      "import org.postgresql.ds.PGSimpleDataSource;", "");

  record Block(String file, int line, String marker, String code) {}

  static List<Block> javaBlocks(String file) {
    String[] lines = Repo.read(file).split("\n", -1);
    List<Block> out = new ArrayList<>();
    for (int i = 0; i < lines.length; i++) {
      Matcher f = FENCE.matcher(lines[i].trim());
      if (!f.matches()) continue;
      int start = i;
      Matcher m = i > 0 ? MARKER.matcher(lines[i - 1].trim()) : null;
      String marker = m != null && m.matches() ? m.group(1) : "";
      StringBuilder body = new StringBuilder();
      for (i++; i < lines.length && !lines[i].trim().equals("```"); i++) body.append(lines[i]).append('\n');
      if (f.group(1).equals("java")) out.add(new Block(file, start + 1, marker, body.toString()));
    }
    return out;
  }

  @Test
  void theDocumentsHaveJavaBlocks() {
    for (String file : FILES) assertTrue(!javaBlocks(file).isEmpty(), file + " has no ```java block");
  }

  @TestFactory
  Stream<DynamicTest> everyJavaBlockRuns() throws Exception {
    List<DynamicTest> tests = new ArrayList<>();
    Path dir = Files.createTempDirectory("backstop-readme");
    for (String file : FILES) {
      for (Block b : javaBlocks(file)) {
        if (b.marker.equals("spring")) continue; // a Spring Boot listener: backstop-spring's SpringReadmeTest runs it
        tests.add(DynamicTest.dynamicTest(b.file + ":" + b.line, () -> run(b, dir)));
      }
    }
    return tests.stream();
  }

  private static void run(Block b, Path dir) throws Exception {
    if (b.marker.startsWith("skip=") && b.marker.length() > 5) {
      throw new org.opentest4j.TestAbortedException(b.file + ":" + b.line + ": not run: " + b.marker.substring(5));
    }
    assertEquals("", b.marker, "unknown marker on a ```java block");
    List<String> want = new ArrayList<>();
    for (String l : b.code.split("\n")) {
      Matcher p = PRINTS.matcher(l);
      if (p.matches()) want.add(p.group(1));
    }
    String name = "Snippet" + b.file.replaceAll("\\W", "_") + "_" + b.line;
    // README.md's blocks are pasteable as is (issue 42): their own imports
    // lead the file, with none added; the others get IMPORTS. The block's
    // lines keep their numbers (+1) in javac's messages.
    String imports = IMPORTS.replace("\n", " "), body = b.code;
    if (b.file.equals("README.md")) {
      StringBuilder own = new StringBuilder();
      String[] lines = b.code.split("\n", -1);
      int i = 0;
      for (; i < lines.length && (lines[i].startsWith("import ") || lines[i].isBlank()); i++) own.append(lines[i]).append(' ');
      imports = own.toString();
      body = "\n".repeat(i) + String.join("\n", java.util.Arrays.copyOfRange(lines, i, lines.length));
    }
    String src = imports + "\npublic class " + name + " { public static void run() throws Exception {\n"
        + body + "\n}}\n";
    Path out = dir.resolve(name);
    Files.createDirectories(out);
    Path java = out.resolve(name + ".java");
    Files.writeString(java, src);
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    assertNotNull(javac, "no javac: run the tests on a JDK");
    String cp = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    ByteArrayOutputStream errs = new ByteArrayOutputStream();
    int rc = javac.run(null, errs, errs, "-cp", cp, "-d", out.toString(), "-Xlint:none", java.toString());
    assertEquals(0, rc, b.file + ":" + b.line + " does not compile:\n" + errs.toString(StandardCharsets.UTF_8));
    // A block that works a RabbitMQ queue does so on the tests' broker.
    if (b.code.contains("RabbitBroker")) System.setProperty("amqp.url", RabbitServer.get().url);
    if (b.code.contains("RedisQueue") || b.code.contains("IdempotencyStore")) {
      System.setProperty("redis.url", RedisServer.get().url);
    }
    // A block on PostgreSQL gets a fresh database of the tests' private server.
    if (b.code.contains("database.url")) {
      PostgresServer pg = PostgresServer.get();
      System.setProperty("database.url", pg.secretUrl(pg.database()));
    }
    ByteArrayOutputStream printed = new ByteArrayOutputStream();
    PrintStream saved = System.out;
    try (URLClassLoader loader = new URLClassLoader(new URL[] {out.toUri().toURL()}, ReadmeTest.class.getClassLoader())) {
      System.setOut(new PrintStream(printed, true, StandardCharsets.UTF_8));
      loader.loadClass(name).getMethod("run").invoke(null);
    } finally {
      System.setOut(saved);
    }
    String text = printed.toString(StandardCharsets.UTF_8);
    List<String> got = text.isEmpty() ? List.of() : List.of(text.split("\n"));
    assertEquals(want, got, b.file + ":" + b.line + ": printed lines");
    assertTrue(new File(out.toFile(), name + ".class").exists());
  }
}
