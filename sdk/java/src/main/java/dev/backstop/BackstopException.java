package dev.backstop;

/**
 * The base of every error this package throws. A bare BackstopException is
 * a module failure (a trap, or an error code the host did not expect); its
 * subclasses say more: {@link PolicyException}, {@link InputException},
 * {@link StateLostException}, {@link RetryException}.
 */
public class BackstopException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public BackstopException(String message) {
    super(message);
  }

  public BackstopException(String message, Throwable cause) {
    super(message, cause);
  }
}
