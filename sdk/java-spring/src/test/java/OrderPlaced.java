/** The README's listener's event. */
public record OrderPlaced(String orderId, String email) {}
