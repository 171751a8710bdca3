package dev.backstop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * testdata/vectors/one_call.json: the one-call methods on a stateless policy
 * answer and throw as Node's and Python's do (a closed policy, then the
 * module's refusal of a negative argument); its arguments of another type
 * than a long are the dynamic languages' alone.
 */
class OneCallTest {
  private static final Map<String, Object> FILE = Repo.json("testdata/vectors/one_call.json");

  private static Object call(Policy p, String method, long arg) {
    switch (method) {
      case "record_success":
        p.recordSuccess(arg);
        return null;
      case "circuit_state":
        return p.circuitState(arg).toString();
      case "budget_tokens":
        return p.budgetTokens(arg).isPresent() ? p.budgetTokens(arg).getAsDouble() : null;
      case "acquire":
        return p.acquire(arg);
      case "attempt_timeout":
        return p.attemptTimeout(arg);
      default:
        throw new AssertionError("unknown method " + method);
    }
  }

  @Test
  @SuppressWarnings("unchecked")
  void everyCaseOfALong() throws Exception {
    PolicyRuntime rt = PolicyRuntime.builder().maxInstances(1).build();
    int n = 0;
    try (rt) {
      for (Map<String, Object> c : (List<Map<String, Object>>) FILE.get("cases")) {
        if (!(c.get("arg") instanceof Number)) continue;
        n++;
        Policy p = rt.load((String) FILE.get("policy"));
        assertTrue(!p.isStateful());
        if (Boolean.TRUE.equals(c.get("closed"))) p.close();
        String method = (String) c.get("method");
        long arg = ((Number) c.get("arg")).longValue();
        String what = method + "(" + arg + ")" + (Boolean.TRUE.equals(c.get("closed")) ? " closed" : "");
        if ("input".equals(c.get("error"))) {
          InputException e = assertThrows(InputException.class, () -> call(p, method, arg), what);
          assertEquals(c.get("message"), e.getMessage(), what);
        } else if ("closed".equals(c.get("error"))) {
          Exception e = assertThrows(Exception.class, () -> call(p, method, arg), what);
          assertTrue(e.getMessage().contains("the policy is closed"), what + ": " + e);
        } else {
          assertEquals(c.get("answer"), call(p, method, arg), what);
        }
        p.close();
      }
    }
    assertEquals(13, n);
  }
}
