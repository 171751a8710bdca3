package dev.backstop;

/**
 * A queue worker's handler: returns for a success, throws for a failure (an
 * {@link HttpStatusException}, an IOException, … classified as the retry loop
 * classifies them). At the worker's handler deadline its thread is
 * interrupted and the attempt fails as a timeout.
 */
@FunctionalInterface
public interface QueueHandler<J> {
  void handle(J job) throws Exception;
}
