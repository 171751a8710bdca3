/** The README's listener calls it (the application's e-mail provider): the HTTP status of a send. */
public interface EmailProvider {
  int send(OrderPlaced event);
}
