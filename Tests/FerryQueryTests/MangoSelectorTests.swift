import FerryCore
import FerryQuery
import Testing

@Suite struct MangoSelectorTests {
    @Test func aSelectorThatIsNotAnObjectIsRefused() {
        #expect(throws: MangoError.self) { try MangoSelector(parsing: .array([])) }
    }
}
