package dev.backstop;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * The Java rows of the one table from language errors to error kinds that
 * every language follows (contract/errorkinds.json, bundled in the jar as
 * dev/backstop/errorkinds.json): each row is a class name, matched by
 * instanceof on the error and then on its causes, optionally with
 * {@code when message has "text"}, and its kind. The first row that matches
 * the error, or else its cause, and so on, wins.
 */
final class ErrorKinds {
  /** One row: the class (null when this JVM lacks it), the message text required (or null), the kind. */
  record Row(String source, Class<?> type, String messageHas, String kind) {
    boolean matches(Throwable t) {
      if (type == null || !type.isInstance(t)) return false;
      return messageHas == null || (t.getMessage() != null && t.getMessage().contains(messageHas));
    }
  }

  static final List<Row> ROWS = load();

  private ErrorKinds() {}

  @SuppressWarnings("unchecked")
  private static List<Row> load() {
    Map<String, Object> table;
    try {
      table = (Map<String, Object>) Json.parse(new String(PolicyRuntime.resource("errorkinds.json"), StandardCharsets.UTF_8));
    } catch (Json.SyntaxException e) {
      throw new IllegalStateException("backstop-policy: errorkinds.json: " + e.getMessage(), e);
    }
    List<Row> rows = new ArrayList<>();
    for (Object o : (List<Object>) table.get("java")) {
      List<Object> row = (List<Object>) o;
      String source = (String) row.get(0);
      String name = source;
      String has = null;
      int at = source.indexOf(" when message has ");
      if (at >= 0) {
        name = source.substring(0, at);
        has = source.substring(at + " when message has ".length()).replaceAll("^\"|\"$", "");
      }
      Class<?> type;
      try {
        type = Class.forName(name, false, ErrorKinds.class.getClassLoader());
      } catch (ClassNotFoundException e) {
        type = null; // a module this JVM does not have (java.net.http): nothing can be of it
      }
      rows.add(new Row(source, type, has, (String) row.get(1)));
    }
    return List.copyOf(rows);
  }

  /** The error kind of t or its causes (at most 8 deep), or null. */
  static String of(Throwable t) {
    Set<Throwable> seen = Collections.newSetFromMap(new IdentityHashMap<>());
    for (Throwable e = t; e != null && seen.size() < 8 && seen.add(e); e = e.getCause()) {
      for (Row r : ROWS) {
        if (r.matches(e)) return r.kind.isEmpty() ? null : r.kind;
      }
    }
    return null;
  }
}
